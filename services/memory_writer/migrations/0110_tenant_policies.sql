-- A tenant's own write rules, set over gRPC (SetTenantPolicy); a tenant without a row follows the
-- deployment's settings. contacts_sensitive: phone numbers and e-mail addresses are sealed, redacted
-- and hashed like ID numbers.
CREATE TABLE IF NOT EXISTS tenant_policies (
    tenant_id           text        PRIMARY KEY,
    contacts_sensitive  boolean     NOT NULL,
    updated_by          text        NOT NULL DEFAULT '',
    updated_at          timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE tenant_policies ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_policies FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON tenant_policies;
CREATE POLICY tenant_isolation ON tenant_policies
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
