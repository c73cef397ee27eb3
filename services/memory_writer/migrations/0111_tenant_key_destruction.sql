-- Forgetting a tenant destroys its keys: a tenant key version's row stays, with its wrapped keys
-- gone and the time they went, so that a key made for the tenant afterwards takes a new version
-- (replicas cache unwrapped tenant keys by version, and a version must never name two keys).
ALTER TABLE tenant_keys ALTER COLUMN wrapped DROP NOT NULL;
ALTER TABLE tenant_keys ALTER COLUMN search_wrapped DROP NOT NULL;
ALTER TABLE tenant_keys ADD COLUMN IF NOT EXISTS destroyed_at timestamptz;
