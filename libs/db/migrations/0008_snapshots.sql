-- Snapshots of event-sourced aggregates: a stream's state at a version, so a long stream is
-- rebuilt from the snapshot and the events after it instead of from its first event.
-- Only the latest snapshot of a stream is kept; `schema` names the state's shape, and a reader
-- that knows another shape ignores the row (and replays in full). Tenant-owned, like events.
CREATE TABLE IF NOT EXISTS snapshots (
    stream_id  text        PRIMARY KEY,
    tenant_id  text        NOT NULL,
    schema     text        NOT NULL,
    version    bigint      NOT NULL CHECK (version > 0),
    state      jsonb       NOT NULL,
    taken_at   timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE snapshots ENABLE ROW LEVEL SECURITY;
ALTER TABLE snapshots FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON snapshots
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
