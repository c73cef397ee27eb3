-- Sensitive memories: `content` holds the redacted text (markers instead of sensitive values);
-- `sealed` the whole content, AES-256-GCM under the user's data key; `content_hmac` a keyed hash
-- of the normalised content (exact-match comparisons without the plaintext).
ALTER TABLE memories ADD COLUMN IF NOT EXISTS sensitive_kind text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS sealed bytea;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS content_hmac text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS sensitive_hashes text[] NOT NULL DEFAULT '{}';

-- Key hierarchy: master key (key provider) > tenant key (a version per rotation) > user data key.
-- Tenant keys and the tenant's search (HMAC) key are stored wrapped by the master key; user data
-- keys wrapped by a tenant key version. Deleting a user's row destroys their key (crypto-shredding).
CREATE TABLE IF NOT EXISTS tenant_keys (
    tenant_id      text        NOT NULL,
    version        integer     NOT NULL,
    wrapped        bytea       NOT NULL,
    search_wrapped bytea       NOT NULL,
    master_key_id  text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, version)
);
CREATE TABLE IF NOT EXISTS user_keys (
    tenant_id       text        NOT NULL,
    user_id         text        NOT NULL,
    wrapped         bytea       NOT NULL,
    tenant_version  integer     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id)
);
ALTER TABLE tenant_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_keys
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
ALTER TABLE user_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE user_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON user_keys
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
