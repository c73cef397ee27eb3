-- A write merged into an identical memory stores no row of its own, so its idempotency key is kept
-- here: a retry of it finds its first result instead of merging (and raising engagement) again.
CREATE TABLE IF NOT EXISTS merged_writes (
    tenant_id        text NOT NULL,
    idempotency_key  text NOT NULL,
    memory_id        uuid NOT NULL REFERENCES memories (memory_id) ON DELETE CASCADE,
    request_hash     text NOT NULL,
    merged_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS merged_writes_memory ON merged_writes (memory_id);
ALTER TABLE merged_writes ENABLE ROW LEVEL SECURITY;
ALTER TABLE merged_writes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON merged_writes
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
