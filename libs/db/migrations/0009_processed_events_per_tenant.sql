-- A processed event is one tenant's: producers choose event ids, and one tenant's id (a uuid5 of a
-- business key, say) must never mark another tenant's event as done. Rows from before this migration
-- have tenant_id '' and still count for every tenant, so that an entry pending across the upgrade takes
-- effect once; housekeeping removes them with the rest after MNEMESH_PROCESSED_RETENTION_DAYS.
ALTER TABLE processed_events ADD COLUMN IF NOT EXISTS tenant_id text NOT NULL DEFAULT '';
ALTER TABLE processed_events DROP CONSTRAINT IF EXISTS processed_events_pkey;
ALTER TABLE processed_events ADD PRIMARY KEY (consumer, tenant_id, event_id);

-- A tenant's unit of work sees and marks its own ids only (and the rows from before, which count for all).
ALTER TABLE processed_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE processed_events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON processed_events
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR tenant_id = ''
           OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
