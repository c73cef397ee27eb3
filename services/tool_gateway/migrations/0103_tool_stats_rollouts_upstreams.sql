-- Procedural memory per tenant, tool and calling context (a hash of the task kind; '' for all):
-- counts, a latency histogram (domain/experience.py BOUNDS_MS), the commonest errors with hints,
-- and argument values of successful calls. Tenant-owned: one tenant never sees another's arguments.
CREATE TABLE IF NOT EXISTS tool_stats (
    tenant_id   text        NOT NULL,
    name        text        NOT NULL,
    context     text        NOT NULL DEFAULT '',
    calls       bigint      NOT NULL DEFAULT 0,
    failures    bigint      NOT NULL DEFAULT 0,
    buckets     bigint[]    NOT NULL,
    errors      jsonb       NOT NULL DEFAULT '{}',
    arguments   jsonb       NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name, context)
);
ALTER TABLE tool_stats ENABLE ROW LEVEL SECURITY;
ALTER TABLE tool_stats FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tool_stats
    USING (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*')
    WITH CHECK (tenant_id = current_setting('mnemesh.tenant_id', true) OR current_setting('mnemesh.tenant_id', true) = '*');

-- Versions and canaries: the pinned stable version and the running canary of a tool.
CREATE TABLE IF NOT EXISTS tool_rollouts (
    name                  text             PRIMARY KEY,
    stable                text             NOT NULL DEFAULT '',
    canary                text             NOT NULL DEFAULT '',
    percent               double precision NOT NULL DEFAULT 0,
    callers               text[]           NOT NULL DEFAULT '{}',
    max_error_rate_delta  double precision NOT NULL DEFAULT 0.2,
    min_calls             integer          NOT NULL DEFAULT 20,
    state                 text             NOT NULL DEFAULT 'stable',
    reason                text             NOT NULL DEFAULT '',
    epoch                 text             NOT NULL DEFAULT '',
    updated_at            timestamptz      NOT NULL DEFAULT now()
);

-- Upstream MCP servers added at run time (AddUpstream); every replica connects to each.
CREATE TABLE IF NOT EXISTS tool_upstreams (
    name      text        PRIMARY KEY,
    config    jsonb       NOT NULL,
    added_at  timestamptz NOT NULL DEFAULT now()
);

-- A caller's chain id (the orchestrator's action id) finds its calls: GetCall before a retry.
ALTER TABLE tool_calls ADD COLUMN IF NOT EXISTS chain_id text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS tool_calls_chain ON tool_calls (tenant_id, chain_id, called_at) WHERE chain_id <> '';

-- Replaced by tool_stats (per tenant and context, with percentiles and errors).
DROP TABLE IF EXISTS tool_experience;
