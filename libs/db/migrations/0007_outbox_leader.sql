-- One relay publishes a service's outbox at a time (the holder of a session advisory lock),
-- so rows go out in id order, and so every aggregate's events in version order, however
-- many replicas run. Each new leader takes a term from this sequence and raises a fence in
-- Redis; a publish carrying an older term (a deposed leader whose XADD hung) is refused.
CREATE SEQUENCE IF NOT EXISTS outbox_leader_term;
DROP INDEX IF EXISTS outbox_unpublished;
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (id) WHERE published_at IS NULL AND failure IS NULL;
