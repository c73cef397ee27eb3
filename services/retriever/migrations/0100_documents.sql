-- The retriever's keyword/structured projection of memory events (rebuildable from them).
CREATE TABLE IF NOT EXISTS documents (
    memory_id    uuid PRIMARY KEY,
    tenant_id    text        NOT NULL,
    user_id      text        NOT NULL,
    session_id   text        NOT NULL DEFAULT '',
    layer        smallint    NOT NULL,
    source       smallint    NOT NULL,
    confidence   smallint    NOT NULL,
    content      text        NOT NULL,
    terms        text[]      NOT NULL,
    tags         text[]      NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz,
    indexed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS documents_owner ON documents (tenant_id, user_id, layer);
CREATE INDEX IF NOT EXISTS documents_terms ON documents USING gin (terms);
