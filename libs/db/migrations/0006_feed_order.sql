-- The global feed keeps each stream's order. An append whose transaction took its id before
-- the previous version's writer (it did other work first) would sort before that version by
-- transaction id alone; such an event inherits the previous version's place instead
-- (feed_tx, feed_pos), and ties within a stream go by version. NULL: the event's own place.
ALTER TABLE events ADD COLUMN IF NOT EXISTS feed_tx xid8;
ALTER TABLE events ADD COLUMN IF NOT EXISTS feed_pos bigint;
CREATE INDEX IF NOT EXISTS events_feed_order
    ON events ((coalesce(feed_tx, transaction_id)), (coalesce(feed_pos, position)), version);
