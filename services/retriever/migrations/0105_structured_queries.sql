-- Structured queries (Retriever.Query) list a tenant's matching memories newest first; the conditions
-- themselves use documents_key (entity keys) and documents_attributes (JSONB containment).
CREATE INDEX IF NOT EXISTS documents_recent ON documents (tenant_id, created_at DESC);
