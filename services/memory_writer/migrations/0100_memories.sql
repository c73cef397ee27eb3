CREATE TABLE IF NOT EXISTS memories (
    memory_id        uuid PRIMARY KEY,
    tenant_id        text        NOT NULL,
    user_id          text        NOT NULL,
    session_id       text        NOT NULL DEFAULT '',
    layer            smallint    NOT NULL,
    source           smallint    NOT NULL,
    content          text        NOT NULL,
    key              text        NOT NULL DEFAULT '',
    confidence       smallint    NOT NULL,
    engagement       double precision NOT NULL DEFAULT 0,
    tags             text[]      NOT NULL DEFAULT '{}',
    derived_from     text[]      NOT NULL DEFAULT '{}',
    step_id          text        NOT NULL DEFAULT '',
    attributes       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz,
    idempotency_key  text
);
CREATE UNIQUE INDEX IF NOT EXISTS memories_idempotency ON memories (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_owner ON memories (tenant_id, user_id, layer);
