-- Idempotent consumers: a handler's effect and this row commit together, so a
-- redelivered event is recognised and acknowledged without a second effect.
CREATE TABLE IF NOT EXISTS processed_events (
    consumer      text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
