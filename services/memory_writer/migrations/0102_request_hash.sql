-- The fingerprint of the write that created a memory under an idempotency key: a later write under
-- the same key is a retry only if it is the same write; a different one is refused, not dropped.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS request_hash text;
