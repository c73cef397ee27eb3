-- Near duplicates: a memory's LSH buckets move from one memory_buckets row each (16 rows, a foreign key
-- and a five-column key per memory written) into one array on the memory. Each key is the first 8 bytes
-- of SHA-256("<user>|<layer>|<bucket>") as a signed bigint; candidates are the user's memories of the
-- layer (index memories_owner) whose keys overlap (&&). No GIN index: its pending list is scanned by
-- every lookup, and a batch makes one lookup per user, which made it slower than the owner index.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS lsh bigint[];
UPDATE memories m SET lsh = k.keys FROM (
    SELECT memory_id, array_agg(('x' || substr(encode(sha256(convert_to(user_id || '|' || layer || '|' || bucket,
                                                                        'UTF8')), 'hex'), 1, 16))::bit(64)::bigint)
           AS keys
    FROM memory_buckets GROUP BY memory_id) k
WHERE m.memory_id = k.memory_id;
DROP TABLE IF EXISTS memory_buckets;
