"""The confidence rules for entity keys: which value of a key is current (no I/O).

- L1 (user-stated, authoritative API) overrides lower levels of the same key and a previous L1
  (a correction: "my name is Zhang" → "sorry, it is Li");
- a value at the same level replaces the current one (the later statement wins);
- a lower level never overwrites a higher one: it is kept as a candidate, reported as such,
  and not served until confirmed;
- the same value again (normalised) at the same or a lower level is a duplicate: nothing new.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from services.memory_writer.domain.model import Confidence, MemoryRecord, Status, WriteStatus
from services.memory_writer.domain.normalize import normalized

__all__ = ["Decision", "confirmed", "decide"]


@dataclass(frozen=True)
class Decision:
    outcome: WriteStatus
    record: MemoryRecord  # what to store (its status set), or the existing memory for a duplicate
    supersedes: MemoryRecord | None = None  # the current value this write replaces


def _fingerprint(record: MemoryRecord) -> str:
    # A sensitive value is compared by its keyed hash: the stored record holds no plaintext to compare.
    return f"hmac:{record.content_hmac}" if record.content_hmac else normalized(record.content)


def decide(new: MemoryRecord, current: MemoryRecord | None) -> Decision:
    """What writing `new` does to its key, whose current value is `current` (None: no value yet)."""
    if current is None:
        return Decision(WriteStatus.STORED, replace(new, status=Status.CURRENT))
    same_value = _fingerprint(new) == _fingerprint(current)
    if same_value and new.confidence >= current.confidence:  # same or weaker: nothing new to say
        return Decision(WriteStatus.DUPLICATE, current)
    if new.confidence > current.confidence:  # weaker (L3 > L2 > L1 in value)
        return Decision(WriteStatus.CANDIDATE, replace(new, status=Status.CANDIDATE))
    return Decision(WriteStatus.STORED, replace(new, status=Status.CURRENT), supersedes=current)


def confirmed(record: MemoryRecord, current: MemoryRecord | None, now: datetime, by: str,
              reason: str) -> tuple[MemoryRecord, MemoryRecord | None]:
    """`record` confirmed by the user: L1, no default expiry, the current value of its key.

    Returns the confirmed record and the one it supersedes (the key's current value, when that
    is another memory).
    """
    raised = replace(record, confidence=Confidence.L1_STRONG, status=Status.CURRENT, changed_at=now,
                     expires_at=None if record.confidence is Confidence.L3_WEAK else record.expires_at,
                     reason=f"confirmed by {by or 'the user'}" + (f": {reason}" if reason else ""))
    if current is not None and current.memory_id != record.memory_id:
        return raised, current
    return raised, None
