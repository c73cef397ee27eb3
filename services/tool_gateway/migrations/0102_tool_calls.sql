-- The audit log of tool calls: one row per call that passed authentication, refused or not.
-- Tenant-owned, so row-level security as on every tenant table (libs/db/migrations/0005).
CREATE TABLE IF NOT EXISTS tool_calls (
    call_id      text        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    caller       text        NOT NULL,
    tool         text        NOT NULL,
    version      text        NOT NULL,
    args_sha256  text        NOT NULL,
    outcome      text        NOT NULL,
    error_type   text        NOT NULL DEFAULT '',
    error        jsonb,
    latency_ms   double precision NOT NULL,
    trace_id     text        NOT NULL DEFAULT '',
    context      text        NOT NULL DEFAULT '',
    called_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tool_calls_tenant_time ON tool_calls (tenant_id, called_at);
CREATE INDEX IF NOT EXISTS tool_calls_tool_time ON tool_calls (tool, called_at);
ALTER TABLE tool_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE tool_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tool_calls
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');
