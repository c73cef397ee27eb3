"""Procedural memory: how a tool has fared, per tenant, per tool and per calling context. No I/O.

One `Experience` per (tool, context): call and failure counts, a latency histogram (fixed
log-spaced buckets, so replicas and replays add up exactly and percentiles need no samples),
the commonest errors each with its hint, and the commonest scalar argument values of
successful calls ("best parameters"). The projection (service_layer/experience.py) folds
tool.called events into it; `note` is the one line tools/list appends to a description.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BOUNDS_MS", "Experience", "Observation", "context_key", "note", "observe", "percentile"]

# Upper bounds of the latency buckets: 0.25 ms × 1.3^i, up to ten minutes (the last bucket is open).
BOUNDS_MS: tuple[float, ...] = tuple(0.25 * 1.3 ** i for i in range(57))
MAX_ERRORS = 8  # distinct errors kept per experience (the rarest go first)
MAX_ARGUMENTS, MAX_VALUES, MAX_VALUE_CHARS = 16, 8, 64
# Refusals that say nothing about the tool (the caller's credentials, an unknown name).
IGNORED_ERRORS = frozenset({"permission_denied", "unauthenticated", "not_found"})


def context_key(context: str) -> str:
    """The calling context as stored: a short hash of the task kind (empty: every context together)."""
    return hashlib.sha256(context.encode()).hexdigest()[:16] if context else ""


@dataclass(frozen=True)
class Observation:
    """One call as experience sees it (from a tool.called event)."""

    ok: bool
    latency_ms: float
    error: dict[str, Any] | None = None  # {error_type, field, reason, hint, ...}
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Experience:
    tool: str
    context: str = ""
    calls: int = 0
    failures: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_MS) + 1))
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)  # "type|field" -> error + count
    arguments: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> JSON value -> count

    @property
    def success_rate(self) -> float:
        return (self.calls - self.failures) / self.calls if self.calls else 0.0

    def common_errors(self) -> list[dict[str, Any]]:
        return sorted(self.errors.values(), key=lambda e: (-e["count"], e["error_type"], e["field"]))

    def best_arguments(self) -> dict[str, list[Any]]:
        return {name: [json.loads(v) for v, _ in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
                for name, values in sorted(self.arguments.items())}


def _bounded(counts: dict[str, Any], most: int, count_of) -> None:
    while len(counts) > most:
        del counts[min(counts, key=lambda k: (count_of(counts[k]), k))]


def _scalar(value: Any) -> str | None:
    """The JSON of a value worth remembering as a 'best parameter': short scalars only."""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= MAX_VALUE_CHARS):
        return json.dumps(value, ensure_ascii=False)
    return None


def observe(exp: Experience, obs: Observation) -> bool:
    """Fold one call into `exp`; False when the call says nothing about the tool (and is not counted)."""
    error_type = str((obs.error or {}).get("error_type", ""))
    if not obs.ok and error_type in IGNORED_ERRORS:
        return False
    exp.calls += 1
    exp.buckets[bisect.bisect_left(BOUNDS_MS, max(obs.latency_ms, 0.0))] += 1
    if not obs.ok:
        exp.failures += 1
        err = obs.error or {}
        key = f"{error_type}|{err.get('field', '')}"
        kept = exp.errors.setdefault(key, {"error_type": error_type, "field": str(err.get("field", "")),
                                           "count": 0})
        kept.update(count=kept["count"] + 1, reason=str(err.get("reason", ""))[:200],
                    hint=str(err.get("hint", ""))[:200])
        _bounded(exp.errors, MAX_ERRORS, lambda e: e["count"])
    else:
        for name, value in obs.arguments.items():
            text = _scalar(value)
            if text is None or (name not in exp.arguments and len(exp.arguments) >= MAX_ARGUMENTS):
                continue
            values = exp.arguments.setdefault(name, {})
            values[text] = values.get(text, 0) + 1
            _bounded(values, MAX_VALUES, lambda c: c)
    return True


def percentile(buckets: list[int], q: float) -> float:
    """The latency (ms) below which a share `q` of calls fell: the upper bound of that bucket."""
    total = sum(buckets)
    if not total:
        return 0.0
    rank, seen = q * total, 0
    for i, count in enumerate(buckets):
        seen += count
        if seen >= rank and count:
            return BOUNDS_MS[min(i, len(BOUNDS_MS) - 1)]
    return BOUNDS_MS[-1]  # pragma: no cover - the loop always reaches the rank


def note(exp: Experience) -> str:
    """'92 % success over 25 calls, p50 12 ms; common error: date: must be ISO 8601 (hint: ...)'."""
    if not exp.calls:
        return ""
    text = (f"{exp.success_rate * 100:.0f} % success over {exp.calls} calls, "
            f"p50 {percentile(exp.buckets, 0.5):.0f} ms")
    common = exp.common_errors()
    if common:
        e = common[0]
        where = f"{e['field']}: " if e["field"] else ""
        text += f"; common error: {e['error_type']} {where}{e['reason']}"[:160]
        if e.get("hint"):
            text += f" (hint: {e['hint'][:100]})"
    return text
