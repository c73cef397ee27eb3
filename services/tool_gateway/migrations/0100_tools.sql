-- The tool registry: several versions of a tool live side by side.
CREATE TABLE IF NOT EXISTS tools (
    name           text        NOT NULL,
    version        text        NOT NULL,
    spec           jsonb       NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
