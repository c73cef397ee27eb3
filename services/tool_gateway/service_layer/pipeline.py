"""The one call pipeline, for MCP tools/call and gRPC CallTool alike.

resolve (direct lookup) → authorise (caller scopes against the tool's) → validate arguments →
chain (the tools it `requires` done in the caller's chain; a step the chain already did with the
same arguments answers its kept result) → rate limit (per caller, per tool; shared) → breaker
(shared) → call with a deadline and bounded retries (exponential backoff, full jitter, retryable
errors only; a timed-out call of a tool that names a status tool is checked against it before any
retry) → fallback chain → clean and cap the result (the whole kept as mem://step/<call_id>) → the
chain's step → audit row + tool.called event (a cancelled call too).

Authentication happened at the entry point: the call arrives with its Principal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from libs.auth import Principal, current_principal
from libs.errors import DomainError, Internal
from libs.logs import get_logger
from services.tool_gateway.domain import (
    CallOutcome,
    CircuitOpen,
    RateLimited,
    ToolCall,
    ToolSpec,
    authorise,
    backoff_seconds,
    clean_result,
    validate_arguments,
)
from services.tool_gateway.domain.calls import args_sha256, step_uri
from services.tool_gateway.domain.chains import (
    check_requires,
    check_room,
    step_hold_seconds,
    step_key,
    step_running,
)
from services.tool_gateway.domain.registry import pick_version
from services.tool_gateway.domain.rollout import Rollout, arm_for, roll_back, rollback_reason
from services.tool_gateway.service_layer.chain_steps import (
    SYSTEM_TENANT,
    CallCancelled,
    drain_detached,
    record_call,
    record_detached,
    replay,
)
from services.tool_gateway.service_layer.ports import (
    Backends,
    Breakers,
    CallLog,
    CanaryCounters,
    ChainStore,
    Gate,
    RateLimiter,
    Registry,
    ResultStore,
)
from services.tool_gateway.service_layer.resolve import not_found, resolve
from services.tool_gateway.service_layer.status_check import timed_out

__all__ = ["SYSTEM_TENANT", "Admitted", "CallCancelled", "CallPolicy", "CallPorts", "admit_call", "breaker_key",
           "call_tool", "drain_detached",
           "resolve", "step_uri"]

log = get_logger(__name__)
# Errors that say the backend (not the caller) is failing: they count against its breaker.
_BREAKER_ERRORS = frozenset({"deadline_exceeded", "unavailable", "backend_error", "internal"})


@dataclass(frozen=True)
class CallPolicy:
    rate_per_caller: float = 50.0
    rate_per_tool: float = 500.0
    result_max_bytes: int = 16_384
    backoff_base: float = 0.05
    backoff_cap: float = 2.0
    # Arguments smaller than this are validated on the loop: a thread hop costs more than the check.
    inline_validation_bytes: int = 4_096


@dataclass
class CallPorts:
    registry: Registry
    limiter: RateLimiter
    breakers: Breakers
    backends: Backends
    call_log: CallLog
    results: ResultStore
    canaries: CanaryCounters
    policy: CallPolicy = field(default_factory=CallPolicy)
    gate: Gate | None = None  # rate limit + breaker in one round trip; None: the two ports one after the other
    chains: ChainStore | None = None  # None: no chain state (a tool that `requires` others is then refused)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Any] = asyncio.sleep


def breaker_key(spec: ToolSpec) -> str:
    """Breakers are per version: a failing canary must not open the circuit of the stable version."""
    return f"{spec.name}@{spec.version}"


async def _route(call: ToolCall, registry: Registry) -> tuple[ToolSpec, Rollout | None, str]:
    """The spec this call runs: the version named, else the caller's arm of the rollout, else the highest.

    Returns (spec, rollout, arm); arm is "" when no canary decided it (its outcome is not counted).
    """
    versions, rollout = await registry.lookup(call.name)
    if call.version or rollout is None:
        spec = pick_version(versions, call.version)
        if spec is None:
            raise not_found(call.name, call.version, bool(versions))
        return spec, None, ""
    arm = arm_for(rollout, call.principal.tenant_id, call.principal.subject)
    wanted = rollout.canary if arm == "canary" else rollout.stable
    spec = pick_version(versions, wanted) or pick_version(versions)  # a removed pin: the highest
    if spec is None:
        raise not_found(call.name, "", False)
    return spec, rollout, arm if rollout.canary else ""


async def _count_arm(spec: ToolSpec, rollout: Rollout, arm: str, ok: bool, ports: CallPorts) -> None:
    """Count the call for its arm; roll the canary back (once, whichever replica sees it) when it fails."""
    counts = await ports.canaries.record(spec.name, rollout.epoch, arm, ok)
    reason = rollback_reason(rollout, counts)
    if reason and await ports.registry.save_rollout(roll_back(rollout, spec.name, reason=reason),
                                                    expect_canary=rollout.canary):
        log.warning("canary rolled back", tool=spec.name, canary=rollout.canary, reason=reason)


async def _validate(spec: ToolSpec, arguments: dict[str, Any], policy: CallPolicy) -> None:
    if len(repr(arguments)) < policy.inline_validation_bytes:
        validate_arguments(spec, arguments)
    else:  # big input: linear (RE2) but CPU all the same, so off the event loop
        await asyncio.to_thread(validate_arguments, spec, arguments)


class _Sequential:
    """The Gate of ports without one: the rate limiter, then the breaker."""

    def __init__(self, limiter: RateLimiter, breakers: Breakers) -> None:
        self.limiter, self.breakers = limiter, breakers

    async def admit(self, buckets: list[tuple[str, float]], tool: str,
                    probe_seconds: float) -> tuple[float, bool, str, float]:
        wait = await self.limiter.acquire(buckets)
        if wait > 0:
            return wait, False, "", 0.0
        return (0.0, *await self.breakers.admit(tool, probe_seconds))


async def _admit(call: ToolCall, spec: ToolSpec, ports: CallPorts) -> tuple[bool, str, float]:
    """Rate limit (per caller, per tool) and the breaker's admission of the first attempt, together."""
    p = call.principal
    gate = ports.gate or _Sequential(ports.limiter, ports.breakers)
    wait, admitted, state, retry_after = await gate.admit(
        [(f"caller:{p.tenant_id}:{p.subject}", ports.policy.rate_per_caller),
         (f"tool:{spec.name}", ports.policy.rate_per_tool)], breaker_key(spec), spec.timeout_seconds)
    if wait > 0:
        raise RateLimited(f"too many calls (per caller {ports.policy.rate_per_caller:g}/s, per tool "
                          f"{ports.policy.rate_per_tool:g}/s)", field="name",
                          hint=f"retry in {wait:.2f} s, and spread calls out")
    return admitted, state, retry_after


async def _attempt(spec: ToolSpec, arguments: dict[str, Any], deadline_at: float | None, ports: CallPorts,
                   principal: Principal, first: tuple[bool, str, float] | None = None) -> tuple[dict[str, Any], int, str]:
    """Call `spec` with bounded retries; returns (result, attempts, confirmed_by) or raises the last error.

    `confirmed_by`: the status tool that said a timed-out call's operation happened ("" otherwise).
    `first`: the breaker's answer for the first attempt when the gate gave it already."""
    attempts = spec.retries + 1
    for attempt in range(1, attempts + 1):
        if attempt == 1 and first is not None:
            admitted, state, retry_after = first
        else:
            admitted, state, retry_after = await ports.breakers.admit(breaker_key(spec), spec.timeout_seconds)
        if not admitted:
            raise CircuitOpen(f"{spec.name} is failing and its circuit breaker is {state.replace('_', '-')}",
                              field="name", hint=f"retry in {retry_after:.1f} s or use another tool")
        timeout = spec.timeout_seconds
        if deadline_at is not None:
            timeout = min(timeout, deadline_at - ports.clock())
        try:
            if timeout <= 0:
                raise TimeoutError
            async with asyncio.timeout(timeout):
                result = await ports.backends.call(spec, arguments, timeout)
        except TimeoutError:
            error, confirmed = await timed_out(spec, arguments, timeout, deadline_at, ports, principal)
            if confirmed is not None:  # it happened, only slowly: no retry; slow all the same for the breaker
                await ports.breakers.record(breaker_key(spec), False)
                return confirmed, attempt, spec.status_tool
        except DomainError as exc:
            error = exc
        else:
            if state == "closed":  # the common case: counted in a batch, off the call's path
                ports.breakers.succeeded(breaker_key(spec))
            else:  # a half-open probe that worked closes its breaker now
                await ports.breakers.record(breaker_key(spec), True)
            return result, attempt, ""
        # A backend's own fault counts against it when retryable (a SOAP Server fault); a fault that says the
        # request was wrong (a Client fault) does not, nor a failure the caller caused (it refused, declined or
        # did not answer what an upstream asked it mid-call: `caller_side`).
        if (error.error_type in _BREAKER_ERRORS or (error.error_type == "backend_fault" and error.retryable)) \
                and not getattr(error, "caller_side", False):
            await ports.breakers.record(breaker_key(spec), False)
        left = None if deadline_at is None else deadline_at - ports.clock()
        if not error.retryable or attempt == attempts or (left is not None and left <= 0):
            error.attempts = attempt  # type: ignore[attr-defined]
            raise error
        delay = backoff_seconds(attempt, base=ports.policy.backoff_base, cap=ports.policy.backoff_cap)
        await ports.sleep(delay if left is None else min(delay, left))
    raise AssertionError("unreachable")  # pragma: no cover


async def _fallbacks(call: ToolCall, spec: ToolSpec, deadline_at: float | None,
                     ports: CallPorts) -> tuple[ToolSpec, dict[str, Any], int] | None:
    """The first fallback that the caller may call, that accepts the arguments, and that answers."""
    for name in spec.fallback:
        if name == spec.name:
            continue
        try:
            alt = await resolve(name, "", ports.registry)
            authorise(alt, call.principal)
            await _validate(alt, call.arguments, ports.policy)
            result, attempts, _ = await _attempt(alt, call.arguments, deadline_at, ports, call.principal)
        except DomainError as exc:
            log.info("fallback failed", tool=spec.name, fallback=name, error_type=exc.error_type)
            continue
        return alt, result, attempts
    return None


@dataclass(frozen=True)
class Admitted:
    """A call that passed every check before its backend (`admit_call`): what running it needs."""

    call_id: str
    spec: ToolSpec
    started: float
    rollout: Rollout | None = None
    arm: str = ""
    admission: tuple[bool, str, float] | None = None  # the breaker's answer for the first attempt
    replayed: CallOutcome | None = None  # the chain's kept result answers it: no backend


async def _check(call: ToolCall, spec: ToolSpec, call_id: str, started: float, ports: CallPorts,
                 rollout: Rollout | None = None, arm: str = "") -> Admitted:
    """authorise → arguments → chain (requires, replay, room) → rate limit and breaker: raises the refusal."""
    authorise(spec, call.principal)
    await _validate(spec, call.arguments, ports.policy)
    tenant = call.principal.tenant_id or SYSTEM_TENANT
    if call.chain_id and ports.chains is not None:
        chain = await ports.chains.load(tenant, call.principal.subject, call.chain_id)
        check_requires(spec, call.chain_id, chain)
        replayed = await replay(call, spec, call_id, chain, tenant, ports)
        if replayed is not None:
            return Admitted(call_id, spec, started, replayed=replayed)
        arguments_hash = args_sha256(call.arguments)
        check_room(chain, call.chain_id, spec.name, arguments_hash, ports.chains.max_steps)
        # Held until record_call, whatever the outcome (a refusal below included): released by this call id.
        if not await ports.chains.claim(tenant, call.principal.subject, call.chain_id,
                                        step_key(call.name, arguments_hash), call_id,
                                        step_hold_seconds(spec, call.deadline_seconds)):
            raise step_running(call.chain_id, call.name)
    else:
        check_requires(spec, "", None)
    return Admitted(call_id, spec, started, rollout, arm, await _admit(call, spec, ports))


async def _run(call: ToolCall, admitted: Admitted, ports: CallPorts) -> CallOutcome:
    if admitted.replayed is not None:
        return admitted.replayed
    spec, call_id, rollout, arm, admission = (admitted.spec, admitted.call_id, admitted.rollout, admitted.arm,
                                              admitted.admission)
    tenant = call.principal.tenant_id or SYSTEM_TENANT
    if call.chain_id:  # GetCall answers "running" until the audit row says how it ended
        await ports.results.mark_running(tenant, call.chain_id, call.deadline_seconds or spec.timeout_seconds)
    deadline_at = ports.clock() + call.deadline_seconds if call.deadline_seconds > 0 else None
    try:
        result, attempts, confirmed_by = await _attempt(spec, call.arguments, deadline_at, ports, call.principal,
                                                        admission)
        served_by, outcome = confirmed_by or spec.name, "ok"
        if arm:
            await _count_arm(spec, rollout, arm, True, ports)
    except DomainError as primary:
        if arm:
            failed = (primary.error_type in _BREAKER_ERRORS or primary.error_type == "circuit_open") \
                and not getattr(primary, "caller_side", False)
            await _count_arm(spec, rollout, arm, not failed, ports)
        # An operation that may have happened (its status tool said running, or could not say) is not repeated
        # by a fallback either.
        repeatable = not getattr(primary, "may_have_happened", False)
        found = await _fallbacks(call, spec, deadline_at, ports) if spec.fallback and repeatable else None
        if found is None:
            raise
        alt, result, attempts = found
        served_by, outcome = alt.name, "fallback"
        log.info("served by a fallback", tool=spec.name, fallback=alt.name, error_type=primary.error_type)
    if not isinstance(result, dict):
        raise Internal(f"{served_by} returned {type(result).__name__}, not an object",
                       hint="operators: fix the backend mapping")
    cleaned = clean_result(result, ports.policy.result_max_bytes)
    uri = step_uri(call_id) if cleaned.truncated else ""
    if cleaned.truncated or call.chain_id:  # kept whole: the resource link, and GetCall's answer
        await ports.results.put(tenant, call_id, cleaned.full_text)
    return CallOutcome(call_id, spec.name, spec.version, result=cleaned, outcome=outcome, resource_uri=uri,
                       served_by=served_by, attempts=attempts, has_output_schema=bool(spec.output_schema))


def _failed(call_id: str, name: str, version: str, error: DomainError, spec: ToolSpec | None) -> CallOutcome:
    """`spec`: the tool the call was routed to (None: refused before that). Whether it declares an output schema
    travels with the failure, since MCP shapes a tool error after it (clients check structured content against
    the schema, errors included)."""
    kind = "timeout" if error.error_type == "deadline_exceeded" else "error"
    return CallOutcome(call_id, name, version, error=error, outcome=kind, attempts=getattr(error, "attempts", 0),
                       has_output_schema=bool(spec is not None and spec.output_schema))


async def admit_call(call: ToolCall, ports: CallPorts) -> Admitted | CallOutcome:
    """The checks before the backend (resolve, authorise, arguments, chain, rate limit, breaker) of a call run
    later (a task), so that a refusal answers the request itself: the Admitted call, to pass to `call_tool`,
    or the refusal's outcome (audited)."""
    current_principal.set(call.principal)
    started = ports.clock()
    call_id = uuid.uuid4().hex
    version, spec = call.version, None
    try:
        spec, rollout, arm = await _route(call, ports.registry)
        version = spec.version
        return await _check(call, spec, call_id, started, ports, rollout, arm)
    except DomainError as exc:
        outcome = replace(_failed(call_id, call.name, version, exc, spec),
                          latency_ms=(ports.clock() - started) * 1000)
        await record_call(call, outcome, ports)
        return outcome


async def call_tool(call: ToolCall, ports: CallPorts, admitted: Admitted | None = None) -> CallOutcome:
    """Run one call through the whole pipeline (from its backend on, when `admit_call` `admitted` it already).
    Refusals and failures come back as the outcome's error (never raised), and every call is audited."""
    current_principal.set(call.principal)  # backends that act for the caller (memory) read it; this task only
    started = admitted.started if admitted is not None else ports.clock()
    call_id = admitted.call_id if admitted is not None else uuid.uuid4().hex
    spec = admitted.spec if admitted is not None else None
    version = spec.version if spec is not None else call.version
    try:
        if admitted is None:
            spec, rollout, arm = await _route(call, ports.registry)
            version = spec.version
            admitted = await _check(call, spec, call_id, started, ports, rollout, arm)
        outcome = await _run(call, admitted, ports)
    except DomainError as exc:
        outcome = _failed(call_id, call.name, version, exc, spec)
    except asyncio.CancelledError:  # the caller went away (or the gateway stops): audited all the same
        cancelled = CallOutcome(call_id, call.name, version, error=CallCancelled(
            "the caller cancelled the call", hint="the call was stopped, upstream too; call again to retry"),
            outcome="cancelled", latency_ms=(ports.clock() - started) * 1000, attempts=0,
            has_output_schema=bool(spec is not None and spec.output_schema))
        record_detached(record_call(call, cancelled, ports))
        raise
    outcome = replace(outcome, latency_ms=(ports.clock() - started) * 1000)
    await record_call(call, outcome, ports)
    return outcome
