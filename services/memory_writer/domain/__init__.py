from services.memory_writer.domain.confidence import Decision, confirmed, decide
from services.memory_writer.domain.events import (
    DomainEvent,
    MemoryArchived,
    MemoryConfirmed,
    MemoryCorrected,
    MemoryExpired,
    MemoryForgotten,
    MemoryMerged,
    MemoryQuarantined,
    MemoryReleased,
    MemoryWritten,
    SessionCompressed,
)
from services.memory_writer.domain.model import (
    Confidence,
    Layer,
    MemoryRecord,
    Source,
    Status,
    WriteMemory,
    WriteResult,
    WriteStatus,
    new_memory,
    request_fingerprint,
)
from services.memory_writer.domain.normalize import normalized

__all__ = ["SessionCompressed", "MemoryArchived", "MemoryExpired", "Confidence", "Decision", "DomainEvent", "Layer", "MemoryConfirmed", "MemoryCorrected", "MemoryForgotten",
           "MemoryMerged", "MemoryQuarantined", "MemoryReleased", "MemoryRecord", "MemoryWritten", "Source", "Status", "WriteMemory", "WriteResult", "WriteStatus",
           "confirmed", "decide", "new_memory", "normalized", "request_fingerprint"]
