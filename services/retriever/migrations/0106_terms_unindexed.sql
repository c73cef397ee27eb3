-- BM25 lives in the vector index (sparse vectors with Qdrant's IDF): nothing searches the projection's
-- `terms` any more, so recording a memory no longer segments it nor pays for this GIN index.
DROP INDEX IF EXISTS documents_terms;
