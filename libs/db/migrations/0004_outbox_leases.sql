-- The relay leases rows in a short transaction, publishes outside it, then marks them;
-- a relay that dies leaves a lease that runs out, and another relay takes the rows.
-- A row that can never be published records why and goes to the dead-letter stream.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS leased_until timestamptz;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS failure text;
CREATE INDEX IF NOT EXISTS processed_events_age ON processed_events (processed_at);
