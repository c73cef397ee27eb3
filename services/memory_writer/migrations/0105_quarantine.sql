-- The poisoning guard: quarantined memories (status 4) keep why they were held.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS quarantine_reasons text[] NOT NULL DEFAULT '{}';
CREATE INDEX IF NOT EXISTS memories_quarantine ON memories (tenant_id, created_at) WHERE status = 4;
CREATE INDEX IF NOT EXISTS memories_recent ON memories (tenant_id, user_id, created_at);
