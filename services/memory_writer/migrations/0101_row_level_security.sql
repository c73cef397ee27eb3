-- Row-level security on the memories (see libs/db/migrations/0005_row_level_security.sql).
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memories
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
