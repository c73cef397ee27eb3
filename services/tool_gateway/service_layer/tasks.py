"""Long-running calls as tasks: answer a task id at once, run the call in the background, keep its state.

A task's state lives in the shared task store (Redis), so any replica answers its status (gRPC
`GetTask`, MCP `tasks/get` and `tasks/result` on the 2025-11-25 revision); the replica that started
it runs the call through the same pipeline as any other call (audit row included). A task whose
call is cancelled (the gateway stops, or the caller cancels it) ends "cancelled", audited so.

While the call runs, its replica renews a lease on the task every `lease_seconds / 3`; a working task
whose lease lapsed lost its replica (killed, or cut off from Redis) and answers "failed", saying so:
its call may or may not have reached the backend, which is for the caller to check (GetCall, or the
tool's status tool) before calling again. That answer is saved (compare-and-set on "working"), and so is
every end: a final state is final, a replica that comes back later cannot turn a lost task "completed".

A task is its caller's: it keeps the caller's subject, and get, wait and cancel need the scope
`tools:call` and the same subject (or `tools:admin`); anyone else is answered that no such task is known.
A caller lists its own tasks only (gRPC `ListTasks`, MCP `tasks/list`), an admin too.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from libs.auth import Principal
from libs.errors import DomainError, NotFound, ValidationFailed
from libs.logs import get_logger
from services.tool_gateway.domain import CallOutcome, RateLimited, ToolCall, error_detail
from services.tool_gateway.service_layer.call_context import reporting_progress
from services.tool_gateway.service_layer.chain_steps import CallCancelled, record_call, record_detached
from services.tool_gateway.service_layer.pipeline import (
    SYSTEM_TENANT,
    Admitted,
    CallPorts,
    admit_call,
    call_tool,
    drain_detached,
)
from services.tool_gateway.service_layer.ports import TaskStore

__all__ = ["LIST_PAGE", "TERMINAL", "TaskEnded", "TaskRunner", "check_task_id", "outcome_to_dict"]

log = get_logger(__name__)
TERMINAL = frozenset({"completed", "failed", "cancelled"})
CALL_SCOPE, ADMIN_SCOPE = "tools:call", "tools:admin"
_TASK_ID = re.compile(r"[0-9a-f]{32}")
_CURSOR = re.compile(r"[0-9]{13}:[0-9]{12}:[0-9a-f]{32}")
LIST_PAGE = 50


def check_task_id(task_id: object, field: str = "task_id") -> str:
    """A task id as the gateway issues them: 32 lowercase hexadecimal characters."""
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        raise ValidationFailed("is not a task id (32 hexadecimal characters)", field=field,
                               hint="use the task id the call answered")
    return task_id


class TaskEnded(DomainError):
    error_type = "task_ended"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def outcome_to_dict(outcome: CallOutcome) -> dict[str, Any]:
    """A call's outcome as JSON, for the task store: what CallTool would have answered."""
    result = outcome.result
    return {"call_id": outcome.call_id, "tool": outcome.tool, "version": outcome.version, "outcome": outcome.outcome,
            "served_by": outcome.served_by, "latency_ms": outcome.latency_ms, "attempts": outcome.attempts,
            "resource_uri": outcome.resource_uri, "replay_of": outcome.replay_of,
            "has_output_schema": outcome.has_output_schema,
            "result": result.value if result is not None else None,
            "truncated": bool(result and result.truncated),
            "error": error_detail(outcome.error) if outcome.error is not None else None}


class TaskRunner:
    """The tasks this replica runs; their state in `store` for every replica."""

    def __init__(self, ports: CallPorts, store: TaskStore, *, ttl_seconds: float = 86_400.0,
                 lease_seconds: float = 15.0, announce_cancel: Callable[[str], Awaitable[None]] | None = None,
                 max_working_per_caller: int = 16) -> None:
        """`announce_cancel(task_id)`: asks every replica to cancel that task (the one running it does)."""
        self.ports, self.store, self.ttl_seconds, self.lease_seconds = ports, store, ttl_seconds, lease_seconds
        self.announce_cancel = announce_cancel
        self.max_working = max_working_per_caller
        self._running: dict[str, asyncio.Task] = {}
        self._began: set[str] = set()  # tasks whose coroutine runs (the others were cancelled before it ran)

    async def start(self, call: ToolCall) -> dict[str, Any]:
        """`begin`, with its refusal raised (its error)."""
        begun = await self.begin(call)
        if isinstance(begun, CallOutcome):
            assert begun.error is not None
            raise begun.error
        return begun

    async def begin(self, call: ToolCall) -> dict[str, Any] | CallOutcome:
        """Check the call as the pipeline does before its backend (resolve, authorise, arguments, chain, rate
        limit, breaker: a refusal answers its outcome here, audited, and no task is made), save the task as
        working (unless its caller has `max_working_per_caller` working already: RateLimited) and start its call;
        the saved state (with `task_id`)."""
        admitted = await admit_call(call, self.ports)
        if isinstance(admitted, CallOutcome):
            return admitted
        tenant = call.principal.tenant_id or SYSTEM_TENANT
        task_id = uuid.uuid4().hex
        now = _now()
        # has_output_schema: how the task's end is answered when it has no outcome (cancelled, lost), as tools/call.
        state = {"task_id": task_id, "state": "working", "tool": call.name, "caller": call.principal.subject,
                 "created_at": now, "updated_at": now, "status_message": f"{call.name} is running",
                 "ttl_ms": int(self.ttl_seconds * 1000), "has_output_schema": bool(admitted.spec.output_schema)}
        working = await self.store.begin(tenant, task_id, state, self.lease_seconds, self.max_working)
        if working <= 0:
            refused = RateLimited(f"you have {-working} working tasks, the most one caller may have "
                                  f"({self.max_working})", field="as_task",
                                  hint="wait for one of them to end (GetTask, MCP tasks/get) or cancel one, then "
                                       "call again; or call without a task")
            outcome = CallOutcome(admitted.call_id, call.name, admitted.spec.version, error=refused, outcome="error",
                                  attempts=0, has_output_schema=state["has_output_schema"])
            await record_call(call, outcome, self.ports)
            return outcome
        with reporting_progress(None):  # the request that started it ends now: no progress goes to it
            task = asyncio.get_running_loop().create_task(self._run(tenant, state, call, admitted),
                                                          name=f"tool task {task_id}")
        self._running[task_id] = task
        task.add_done_callback(lambda done: self._finished(done, tenant, state, call, admitted))
        return state

    def _finished(self, task: asyncio.Task, tenant: str, state: dict[str, Any], call: ToolCall,
                  admitted: Admitted) -> None:
        """A task cancelled before its coroutine ran at all (cancelled at once) has not ended its state nor
        audited its call: do both here."""
        self._running.pop(state["task_id"], None)
        if not task.cancelled() or state["task_id"] in self._began:
            self._began.discard(state["task_id"])
            return
        cancelled = CallOutcome(admitted.call_id, call.name, admitted.spec.version, error=CallCancelled(
            "the caller cancelled the call before it started", hint="call again to run it"), outcome="cancelled",
            attempts=0)
        record_detached(record_call(call, cancelled, self.ports))
        record_detached(self._end(tenant, state, "cancelled", "the call was cancelled before it started"))

    async def _renew(self, tenant: str, subject: str, task_id: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.store.hold(tenant, subject, task_id, self.lease_seconds)
            except Exception as exc:  # noqa: BLE001 - Redis away for a moment: the next renewal may make it
                log.warning("task lease not renewed", task_id=task_id, error=repr(exc)[:200])

    async def _run(self, tenant: str, state: dict[str, Any], call: ToolCall, admitted: Admitted) -> None:
        self._began.add(state["task_id"])
        renewing = asyncio.get_running_loop().create_task(self._renew(tenant, state["caller"], state["task_id"]))
        try:
            await self._call(tenant, state, call, admitted)
        finally:
            renewing.cancel()

    async def _call(self, tenant: str, state: dict[str, Any], call: ToolCall, admitted: Admitted) -> None:
        try:
            outcome = await call_tool(call, self.ports, admitted)
        except asyncio.CancelledError:
            try:
                await asyncio.shield(self._end(tenant, state, "cancelled", "the call was cancelled before it ended"))
            except Exception as exc:  # noqa: BLE001 - Redis gone at shutdown: the task stays "working" until its TTL
                log.warning("cancelled task not saved", task_id=state["task_id"], error=repr(exc)[:200])
            raise
        except Exception as exc:  # noqa: BLE001 - the pipeline answers failures as outcomes; this is a bug or Redis
            log.error("task failed outside the pipeline", task_id=state["task_id"], error=repr(exc)[:300])
            await self._end(tenant, state, "failed", f"the gateway failed to run the call ({type(exc).__name__})")
            return
        if outcome.error is None:
            await self._end(tenant, state, "completed", f"{call.name} answered ({outcome.outcome})", outcome)
        else:
            await self._end(tenant, state, "failed", f"{outcome.error.error_type}: {outcome.error.reason}"[:500],
                            outcome)

    async def _end(self, tenant: str, state: dict[str, Any], how: str, message: str,
                   outcome: CallOutcome | None = None) -> None:
        ended = {**state, "state": how, "updated_at": _now(), "status_message": message}
        if outcome is not None:
            ended["outcome"] = outcome_to_dict(outcome)
        if not await self.store.end(tenant, state["task_id"], ended):
            # Already final (answered lost by a replica that read it after its lease lapsed): it stays so.
            log.warning("task already final; this end is not kept", task_id=state["task_id"], state=how)

    async def _load(self, principal: Principal | None, task_id: str) -> tuple[str, dict[str, Any]]:
        """The caller's task (tenant, state): only its own (or any, for tools:admin), with tools:call."""
        check_task_id(task_id)
        tenant = (principal.tenant_id if principal else "") or SYSTEM_TENANT
        state = await self.store.load(tenant, task_id)
        if state is None or principal is None or not principal.has_scope(CALL_SCOPE) or (
                state.get("caller") != principal.subject and not principal.has_scope(ADMIN_SCOPE)):
            raise NotFound(f"no task {task_id!r} of yours is known (never started, or expired)",
                           field="task_id", hint="use the task id the call answered; tasks are kept for a while only")
        return tenant, state

    async def get(self, principal: Principal | None, task_id: str) -> dict[str, Any]:
        tenant, state = await self._load(principal, task_id)
        if state["state"] == "working" and not await self.store.held(tenant, task_id):
            lost = {**state, "state": "failed", "lost": True, "updated_at": _now(),
                    "status_message": "the gateway replica running this task stopped before it ended; the call "
                                      "may or may not have reached the tool: check (GetCall, or the tool's "
                                      "status tool) before calling again"}
            if await self.store.end(tenant, task_id, lost):
                return lost
            # It ended (and its lease lapsed) between the two reads: its end stands.
            state = await self.store.load(tenant, task_id) or state
        return state

    async def list(self, principal: Principal | None, cursor: str = "", *,
                   limit: int = LIST_PAGE) -> tuple[list[dict[str, Any]], str]:
        """The caller's own tasks still kept (scope tools:call; an admin's too are only its own), oldest first, a
        page of at most `limit` after `cursor` (from the last page; "" for the first), and the next page's cursor
        ("" at the end). A working task whose lease lapsed is listed failed, as `get` answers it."""
        if not 1 <= limit <= LIST_PAGE:
            raise ValidationFailed(f"must be between 1 and {LIST_PAGE}", field="limit",
                                   hint=f"ask at most {LIST_PAGE} tasks a page and go on with the next page's cursor")
        if cursor and not _CURSOR.fullmatch(cursor):
            raise ValidationFailed("is not a cursor of this gateway's (malformed)", field="cursor",
                                   hint="pass the cursor of the last page as it was, or none for the first page")
        if principal is None or not principal.has_scope(CALL_SCOPE):
            return [], ""
        tenant = principal.tenant_id or SYSTEM_TENANT
        states, after = await self.store.list(tenant, principal.subject, cursor, limit)
        listed = []
        for state in states:
            if state["state"] == "working" and not await self.store.held(tenant, state["task_id"]):
                with contextlib.suppress(NotFound):  # expired between the two reads
                    listed.append(await self.get(principal, state["task_id"]))  # answers it lost
                continue
            listed.append(state)
        return listed, after

    async def wait(self, principal: Principal | None, task_id: str, *, poll_seconds: float = 0.1,
                   timeout_seconds: float = 300.0) -> dict[str, Any]:
        """The task's state once it ended (polled from the store: any replica may be running it)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_seconds
        while True:
            state = await self.get(principal, task_id)
            if state["state"] in TERMINAL or loop.time() >= until:
                return state
            await asyncio.sleep(poll_seconds)

    async def cancel_task(self, principal: Principal | None, task_id: str, *,
                          wait_seconds: float = 5.0) -> dict[str, Any]:
        """Cancel a working task of the caller's, whichever replica runs it; its state after (at most
        `wait_seconds` later: "cancelled", or "working" still when its replica has not answered yet)."""
        state = await self.get(principal, task_id)
        if state["state"] in TERMINAL:
            raise TaskEnded(f"the task already ended ({state['state']})", field="task_id",
                            hint="read its result (GetTask, MCP tasks/result)")
        if not self.cancel(task_id) and self.announce_cancel is not None:
            await self.announce_cancel(task_id)
        return await self.wait(principal, task_id, poll_seconds=0.05, timeout_seconds=wait_seconds)

    def cancel(self, task_id: str) -> bool:
        """Cancel a task running in this replica (False: not here)."""
        task = self._running.get(task_id)
        if task is None:
            return False
        task.cancel()
        return True

    async def close(self) -> None:
        """Cancel the tasks still running (each ends "cancelled", audited) and wait for them."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await drain_detached()
