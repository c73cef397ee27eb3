-- Expiry, decay and archive: engagement decays with a half-life from `engagement_at` and rises with
-- accesses; memories idle past the archive period become archived (status 5), out of default search.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS engagement_at timestamptz;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS last_accessed_at timestamptz;
CREATE INDEX IF NOT EXISTS memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_idle ON memories (tenant_id, (coalesce(last_accessed_at, created_at)))
    WHERE status = 1;
