-- Procedural memory, projected from tool events: how each tool has fared.
CREATE TABLE IF NOT EXISTS tool_experience (
    name              text PRIMARY KEY,
    calls             bigint NOT NULL DEFAULT 0,
    failures          bigint NOT NULL DEFAULT 0,
    total_latency_ms  double precision NOT NULL DEFAULT 0,
    last_error        text   NOT NULL DEFAULT '',
    updated_at        timestamptz NOT NULL DEFAULT now()
);
