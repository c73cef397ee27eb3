from libs.events.envelope import Envelope, MalformedEvent
from libs.events.schema import EVENT_TYPES, STREAMS, EventType, dead_letter_stream

__all__ = ["EVENT_TYPES", "STREAMS", "Envelope", "EventType", "MalformedEvent", "dead_letter_stream"]
