"""The call pipeline's bookkeeping after (or instead of) a backend: a chain's replayed step, the chain's
new step, the audit row and event; a cancelled call's audit row, written from a task of its own."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from libs.errors import DomainError
from libs.logs import get_logger
from services.tool_gateway.domain import CallOutcome, CallRecord, ToolCall, ToolSpec, args_sha256, clean_result
from services.tool_gateway.domain.calls import step_uri
from services.tool_gateway.domain.chains import Chain, ChainStep, kept_step, step_key

if TYPE_CHECKING:
    from services.tool_gateway.service_layer.pipeline import CallPorts

__all__ = ["SYSTEM_TENANT", "CallCancelled", "drain_detached", "record_call", "record_detached", "replay"]

log = get_logger(__name__)
SYSTEM_TENANT = "_system"  # the audit tenant of callers without one (authentication disabled)
# Outcomes that make a step of the caller's chain (beside failures that reached a backend): refusals do not.
_CHAIN_STEPS = frozenset({"ok", "fallback", "replayed", "cancelled"})


async def replay(call: ToolCall, spec: ToolSpec, call_id: str, chain: Chain | None, tenant: str,
                  ports: CallPorts) -> CallOutcome | None:
    """The kept result of the chain's successful step of this tool with these arguments, if still kept."""
    step = kept_step(chain, spec.name, args_sha256(call.arguments))
    if step is None:
        return None
    text = await ports.results.get(tenant, step.result_key)
    if text is None:  # the result expired before the chain: run the step again
        return None
    await ports.results.put(tenant, call_id, text)  # GetCall of this call (or of the chain id) answers it too
    cleaned = clean_result(json.loads(text), ports.policy.result_max_bytes)
    uri = step_uri(call_id) if cleaned.truncated else ""
    return CallOutcome(call_id, spec.name, spec.version, result=cleaned, outcome="replayed", resource_uri=uri,
                       served_by=spec.name, attempts=0, has_output_schema=bool(spec.output_schema),
                       replay_of=step.call_id)


class CallCancelled(DomainError):
    error_type = "cancelled"


_DETACHED: set[asyncio.Task] = set()


def record_detached(coro: Any) -> None:
    """Record a cancelled call's row in a task of its own: the cancelled one may not await any more (an anyio
    cancel scope cancels every await under it)."""
    task = asyncio.get_running_loop().create_task(coro, name="audit of a cancelled call")
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)


async def drain_detached() -> None:
    """Wait for the audit rows of cancelled calls still being queued (before the audit log closes)."""
    if _DETACHED:
        await asyncio.gather(*list(_DETACHED), return_exceptions=True)


async def record_call(call: ToolCall, outcome: CallOutcome, ports: CallPorts) -> None:
    """The audit row and event, then the chain's step (calls that reached a backend, or replayed one)."""
    p = call.principal
    tenant = p.tenant_id or SYSTEM_TENANT
    arguments_hash = args_sha256(call.arguments)
    error = outcome.error.to_dict() if outcome.error else None
    await ports.call_log.record(CallRecord(
        call_id=outcome.call_id, tenant_id=tenant, caller=p.subject, tool=call.name,
        version=outcome.version, args_sha256=arguments_hash, outcome=outcome.outcome, error=error,
        latency_ms=outcome.latency_ms, trace_id=call.trace_id, context=call.context,
        arguments=call.arguments if outcome.error is None else {}, served_by=outcome.served_by,
        attempts=outcome.attempts, chain_id=call.chain_id))
    if call.chain_id and ports.chains is not None:  # the step's hold, if this call took it (else nothing)
        try:
            await ports.chains.release(tenant, p.subject, call.chain_id, step_key(call.name, arguments_hash),
                                       outcome.call_id)
        except Exception as exc:  # noqa: BLE001 - the hold then lapses after its time
            log.warning("chain step hold not released", chain_id=call.chain_id, tool=call.name,
                        error=repr(exc)[:200])
    if not call.chain_id or ports.chains is None or not (outcome.attempts > 0 or outcome.outcome in _CHAIN_STEPS):
        return
    # A replayed step only renews the chain (the store keeps the done step it replayed, and its first call);
    # its result is kept under its own call id too, should the chain have lost that step meanwhile.
    done = outcome.outcome in ("ok", "fallback", "replayed")
    try:
        await ports.chains.record(tenant, p.subject, call.chain_id, ChainStep(
            tool=call.name, args_sha256=arguments_hash, call_id=outcome.call_id, outcome=outcome.outcome,
            result_key=outcome.call_id if done else "", at=time.time()))
    except Exception as exc:  # noqa: BLE001 - the call happened and is audited; the chain only loses this step
        log.warning("chain step not kept", chain_id=call.chain_id, tool=call.name, error=repr(exc)[:200])
