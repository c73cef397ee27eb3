"""A timed-out call of a tool that names a status tool: did its operation happen after all?

Asked before any retry (service_layer/pipeline.py `_attempt`); the rules that read the answer are
domain/status.py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from libs.auth import Principal
from libs.errors import DeadlineExceeded, DomainError
from libs.logs import get_logger
from services.tool_gateway.domain import ToolSpec, authorise
from services.tool_gateway.domain.registry import output_error
from services.tool_gateway.domain.status import DONE, RUNNING, confirmed_result, status_verdict
from services.tool_gateway.service_layer.resolve import resolve

if TYPE_CHECKING:
    from services.tool_gateway.service_layer.pipeline import CallPorts

__all__ = ["timed_out"]

log = get_logger(__name__)


async def _check_status(spec: ToolSpec, arguments: dict[str, Any], deadline_at: float | None,
                        ports: CallPorts, principal: Principal) -> tuple[str, dict[str, Any] | None, str]:
    """Ask `spec`'s status tool (same arguments) whether the operation of a timed-out call happened:
    (verdict, its answer, why the state is unknown); the verdict is "unknown" when it cannot say. The caller
    must be allowed to call the status tool too (its scopes): the gateway asks it on the caller's behalf."""
    left = None if deadline_at is None else deadline_at - ports.clock()
    try:
        status = await resolve(spec.status_tool, "", ports.registry)
        authorise(status, principal)
        timeout = status.timeout_seconds if left is None else min(status.timeout_seconds, left)
        if timeout <= 0:
            return "unknown", None, "no time was left to ask it"
        async with asyncio.timeout(timeout):
            answer = await ports.backends.call(status, arguments, timeout)
    except TimeoutError:
        return "unknown", None, f"{spec.status_tool} did not answer in time either"
    except DomainError as exc:
        return "unknown", None, f"{spec.status_tool} failed: {exc.error_type}: {exc.reason}"[:300]
    if not isinstance(answer, dict):
        return "unknown", None, f"{spec.status_tool} answered {type(answer).__name__}, not an object"
    return status_verdict(answer), answer, ""


async def timed_out(spec: ToolSpec, arguments: dict[str, Any], timeout: float, deadline_at: float | None,
                     ports: CallPorts, principal: Principal) -> tuple[DeadlineExceeded, dict[str, Any] | None]:
    """The error of a timed-out attempt, or (with a status tool that says it happened) the operation's result,
    which must match `spec`'s output schema (it answers for `spec`): otherwise whether it happened is unknown."""
    error = DeadlineExceeded(f"{spec.name} did not answer within {max(timeout, 0):.2f} s",
                             field="deadline_seconds", hint="retry later, or give the call a longer deadline")
    if not spec.status_tool:
        return error, None
    verdict, answer, why = await _check_status(spec, arguments, deadline_at, ports, principal)
    log.info("timed-out call checked", tool=spec.name, status_tool=spec.status_tool, verdict=verdict)
    if verdict == DONE and answer is not None:
        confirmed = confirmed_result(answer)
        mismatch = output_error(spec, confirmed)
        if not mismatch:
            return error, confirmed
        verdict, why = "unknown", f"{spec.status_tool} said done, but its result does not match the output " \
                                  f"schema of {spec.name} ({mismatch})"
    if verdict == RUNNING:
        error = DeadlineExceeded(f"{spec.name} did not answer within {max(timeout, 0):.2f} s and "
                                 f"{spec.status_tool} says the operation is still running", field="deadline_seconds",
                                 retryable=False, hint=f"do not call {spec.name} again: ask {spec.status_tool} "
                                                       "with the same arguments until it is done")
    elif verdict != DONE:  # not done: the timeout stays retryable
        if verdict == "unknown":
            error = DeadlineExceeded(f"{spec.name} did not answer within {max(timeout, 0):.2f} s, and whether the "
                                     f"operation happened is unknown ({why})", field="deadline_seconds",
                                     retryable=False, hint=f"ask {spec.status_tool} with the same arguments "
                                                           f"before calling {spec.name} again")
        else:
            return error, None
    error.may_have_happened = True  # type: ignore[attr-defined]  # no fallback may repeat it either
    return error, None
