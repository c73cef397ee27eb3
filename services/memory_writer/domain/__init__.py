from services.memory_writer.domain.events import DomainEvent, MemoryForgotten, MemoryWritten
from services.memory_writer.domain.model import (
    Confidence,
    Layer,
    MemoryRecord,
    Source,
    WriteMemory,
    WriteResult,
    new_memory,
    request_fingerprint,
)

__all__ = ["Confidence", "DomainEvent", "Layer", "MemoryForgotten", "MemoryRecord", "MemoryWritten", "Source",
           "WriteMemory", "WriteResult", "new_memory", "request_fingerprint"]
