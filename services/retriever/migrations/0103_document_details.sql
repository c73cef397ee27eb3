-- What a search hit reports and the structured path filters on: entity key, typed attributes,
-- provenance, engagement, archiving.
ALTER TABLE documents ADD COLUMN IF NOT EXISTS key          text    NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN IF NOT EXISTS derived_from text[]  NOT NULL DEFAULT '{}';
ALTER TABLE documents ADD COLUMN IF NOT EXISTS engagement   double precision NOT NULL DEFAULT 0;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS archived     boolean NOT NULL DEFAULT false;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS step_id      text    NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN IF NOT EXISTS attributes   jsonb   NOT NULL DEFAULT '{}';
CREATE INDEX IF NOT EXISTS documents_key ON documents (tenant_id, key) WHERE key <> '';
CREATE INDEX IF NOT EXISTS documents_attributes ON documents USING gin (attributes jsonb_path_ops);
