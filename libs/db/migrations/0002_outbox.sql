-- Transactional outbox: written in the same transaction as the change it announces,
-- published to Redis Streams by the relay, then marked.
CREATE TABLE IF NOT EXISTS outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream        text        NOT NULL,
    event_id      uuid        NOT NULL UNIQUE,
    fields        jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
