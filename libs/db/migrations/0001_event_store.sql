-- Event store: per-stream versions are gapless and unique (the primary key), the
-- global order is (transaction_id, position) so catch-up readers can fence on
-- the oldest running transaction and never pass an event committed late.
CREATE TABLE IF NOT EXISTS events (
    position        bigint GENERATED ALWAYS AS IDENTITY,
    transaction_id  xid8        NOT NULL DEFAULT pg_current_xact_id(),
    stream_id       text        NOT NULL,
    version         bigint      NOT NULL CHECK (version > 0),
    event_id        uuid        NOT NULL UNIQUE,
    event_type      text        NOT NULL,
    schema_version  int         NOT NULL,
    tenant_id       text        NOT NULL,
    payload         text        NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_id, version)
);
CREATE INDEX IF NOT EXISTS events_global_order ON events (transaction_id, position);
