-- Confidence rules and corrections: one current value per entity key of a user; lower levels are
-- kept as candidates, replaced values as superseded (the chain: superseded_by, changed_at, reason).
ALTER TABLE memories ADD COLUMN IF NOT EXISTS status smallint NOT NULL DEFAULT 1;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS superseded_by uuid;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS changed_at timestamptz;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS written_by text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS reason text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX IF NOT EXISTS memories_current_key ON memories (tenant_id, user_id, key)
    WHERE status = 1 AND key <> '';
CREATE INDEX IF NOT EXISTS memories_key_history ON memories (tenant_id, user_id, key, created_at)
    WHERE key <> '';

-- The formats tenants register for their entity keys (a JSON Schema per key).
CREATE TABLE IF NOT EXISTS entity_schemas (
    tenant_id   text        NOT NULL,
    key         text        NOT NULL,
    schema      jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
ALTER TABLE entity_schemas ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_schemas FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON entity_schemas
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
