-- Deduplication: identical memories (normalised content, per user and layer) are merged into one row;
-- near duplicates (MinHash over character shingles) are linked to the memory they resemble.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS content_digest text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS minhash bigint[];
ALTER TABLE memories ADD COLUMN IF NOT EXISTS near_duplicate_of uuid;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS merged_count integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS memories_digest ON memories (tenant_id, user_id, layer, content_digest)
    WHERE content_digest <> '';
-- LSH buckets of each memory's MinHash signature: a shared bucket makes two memories candidates.
CREATE TABLE IF NOT EXISTS memory_buckets (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    layer      smallint NOT NULL,
    bucket     text NOT NULL,
    memory_id  uuid NOT NULL REFERENCES memories (memory_id) ON DELETE CASCADE,
    PRIMARY KEY (tenant_id, user_id, layer, bucket, memory_id)
);
CREATE INDEX IF NOT EXISTS memory_buckets_memory ON memory_buckets (memory_id);
ALTER TABLE memory_buckets ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_buckets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_buckets
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
