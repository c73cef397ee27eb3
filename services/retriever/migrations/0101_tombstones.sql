-- Forgotten memories stay forgotten: events may arrive out of order (a retried
-- memory.written after its memory.forgotten), so the projection keeps tombstones
-- and refuses to index a forgotten memory again.
CREATE TABLE IF NOT EXISTS tombstones (
    memory_id     uuid PRIMARY KEY,
    tenant_id     text        NOT NULL,
    forgotten_at  timestamptz NOT NULL DEFAULT now()
);
