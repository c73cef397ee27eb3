-- The projection is two steps: the event's transaction records the document (cheap, one per event);
-- a projector then embeds the recorded documents in batches and upserts them into the vector index
-- with one call per batch. `projected` is that queue, durable across crashes; `version` refuses a
-- stale memory.written (a correction's older version delivered late).
ALTER TABLE documents ADD COLUMN IF NOT EXISTS version   bigint  NOT NULL DEFAULT 0;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS projected boolean NOT NULL DEFAULT true;
CREATE INDEX IF NOT EXISTS documents_unprojected ON documents (indexed_at) WHERE NOT projected;
