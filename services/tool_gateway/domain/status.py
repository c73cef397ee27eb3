"""What a status tool's answer says about an operation whose call timed out. No I/O here.

A tool whose calls must not run twice (a payment, a booking) names a status tool in its spec
(`status_tool`). When a call of it times out, the gateway asks the status tool, with the same
arguments, before any retry: the operation may have happened at the backend after all. The
answer is an object whose `status` (or `state`) says so; `done: true` counts as done too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DONE", "NOT_DONE", "RUNNING", "confirmed_result", "status_verdict"]

DONE, RUNNING, NOT_DONE = "done", "running", "not_done"
_DONE_WORDS = frozenset({"done", "completed", "complete", "succeeded", "success", "ok", "applied", "exists"})
_RUNNING_WORDS = frozenset({"running", "pending", "working", "in_progress", "processing", "queued", "accepted"})


def status_verdict(answer: dict[str, Any]) -> str:
    """DONE (it happened: no retry), RUNNING (still under way: no retry either) or NOT_DONE (retry is safe)."""
    if answer.get("done") is True:
        return DONE
    word = str(answer.get("status") or answer.get("state") or "").strip().lower().replace("-", "_").replace(" ", "_")
    if word in _DONE_WORDS:
        return DONE
    if word in _RUNNING_WORDS:
        return RUNNING
    return NOT_DONE


def confirmed_result(answer: dict[str, Any]) -> dict[str, Any]:
    """The result a confirmed operation answers: the status answer's `result` object, else the answer itself."""
    result = answer.get("result")
    return result if isinstance(result, dict) else answer
