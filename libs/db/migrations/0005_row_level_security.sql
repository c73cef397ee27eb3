-- Row-level security on every tenant-owned table: a unit of work states its tenant with
-- SET LOCAL mnemesh.tenant_id, and sees and writes only that tenant's rows; '*' is the
-- mesh's own machinery (relays, global feeds), which no tenant id can spell.
-- FORCE applies the policies to the table owner too; only superusers read through them,
-- and the services never act as one (libs/db/roles.py).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS tenant_id text;
UPDATE outbox SET tenant_id = fields->>'tenant_id' WHERE tenant_id IS NULL;
ALTER TABLE outbox ALTER COLUMN tenant_id SET NOT NULL;

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');

ALTER TABLE outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON outbox
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
