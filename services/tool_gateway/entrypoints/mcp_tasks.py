"""MCP tasks (the 2025-11-25 revision): a `tools/call` with `task` answers a task at once; `tasks/get`
polls it and `tasks/result` waits for its result. Translate only: the calls run in the TaskRunner.

The official SDK (2.3.0) defines the task types but serves none of their methods ("types-only":
tasks left the core spec in 2026-07-28 for an extension), and it checks a `tools/call` answer as a
CallToolResult, which a CreateTaskResult is not. So:

- a server middleware answers a `tools/call` whose params carry `task` itself, before the SDK checks
  the answer; the CreateTaskResult it sends also carries an empty `content`, so that clients checking
  every `tools/call` answer as a CallToolResult (the SDK's own client does) accept it;
- `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/list` are request handlers of their own (methods
  the SDK does not know pass through to them); a cancellation reaches the replica running the task over
  Redis; `tasks/list` lists the caller's own tasks, oldest first, 50 a page;
- the initialize answer announces `capabilities.tasks` (`list`, `cancel`, `requests.tools.call`), and tools/list marks
  every tool `execution.taskSupport: "optional"`.

On 2026-07-28 (no tasks in the core protocol) a `task` is ignored and the call answers as usual;
gRPC `CallTool` with `as_task` and `GetTask` serve every caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from libs.auth import Principal
from libs.errors import DomainError, ValidationFailed
from services.tool_gateway.domain import CallOutcome, CleanResult, ToolCall
from services.tool_gateway.entrypoints.calls import current_trace_id
from services.tool_gateway.service_layer.tasks import TaskRunner, check_task_id

__all__ = ["TASK_REVISIONS", "TaskMiddleware", "capabilities", "stored_outcome", "task_handlers", "wire_task"]

TASK_REVISIONS = frozenset({"2025-11-25"})
RELATED_TASK = "io.modelcontextprotocol/related-task"
POLL_MS = 500


def capabilities() -> types.ServerTasksCapability:
    return types.ServerTasksCapability(list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
                                       requests=types.ServerTasksRequestsCapability(
        tools=types.TasksToolsCapability(call=types.TasksCallCapability())))


def wire_task(state: dict[str, Any]) -> dict[str, Any]:
    """A stored task as the MCP Task object."""
    return {"taskId": state["task_id"], "status": state["state"], "statusMessage": state.get("status_message", ""),
            "createdAt": state["created_at"], "lastUpdatedAt": state["updated_at"], "ttl": state.get("ttl_ms"),
            "pollInterval": POLL_MS}


class _StoredError(DomainError):
    """A failure read back from the task store, with the error_type it was stored with."""

    def __init__(self, detail: dict[str, Any]) -> None:
        super().__init__(str(detail.get("reason", "")), field=str(detail.get("field", "")),
                         hint=str(detail.get("hint", "")), retryable=bool(detail.get("retryable", False)))
        self.error_type = str(detail.get("error_type", "error"))  # type: ignore[misc]
        if detail.get("fault"):
            self.fault = detail["fault"]


def stored_outcome(d: dict[str, Any]) -> CallOutcome:
    """The CallOutcome a task stored (tasks.outcome_to_dict), to answer like any call."""
    result = None
    if d.get("result") is not None:
        text = json.dumps(d["result"], separators=(",", ":"), ensure_ascii=False)
        result = CleanResult(d["result"], text, bool(d.get("truncated")), text)
    return CallOutcome(d["call_id"], d["tool"], d["version"], result=result,
                       error=_StoredError(d["error"]) if d.get("error") else None, outcome=d["outcome"],
                       latency_ms=d.get("latency_ms", 0.0), resource_uri=d.get("resource_uri", ""),
                       served_by=d.get("served_by", ""), attempts=d.get("attempts", 0),
                       has_output_schema=d.get("has_output_schema", False), replay_of=d.get("replay_of", ""))


class TaskMiddleware:
    """Answers a task-augmented `tools/call` (2025-11-25) with the task, the call running in the background."""

    def __init__(self, runner: TaskRunner, caller, chain_id_of,
                 answer: Callable[[CallOutcome], types.CallToolResult]) -> None:
        """`answer`: a refusal's outcome as the tool result a `tools/call` would have had."""
        self.runner, self.caller, self.chain_id_of, self.answer = runner, caller, chain_id_of, answer

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        params = ctx.params if isinstance(ctx.params, dict) else None
        if (ctx.method != "tools/call" or params is None or params.get("task") is None
                or ctx.protocol_version not in TASK_REVISIONS):
            return await call_next(ctx)
        try:
            typed = types.CallToolRequestParams.model_validate(params, by_name=False)
        except ValidationError as exc:  # a structured error naming the field, not pydantic's text
            first = exc.errors()[0]
            field = "/".join(str(part) for part in first["loc"]) or "params"
            detail = ValidationFailed(str(first["msg"])[:300], field=f"params/{field}",
                                      hint="see tools/call in the MCP specification (name, arguments, task)")
            raise MCPError(types.INVALID_PARAMS, f"{detail.error_type}: {detail.field}: {detail.reason}",
                           detail.to_dict()) from None
        caller: Principal | None = self.caller(ctx)
        if caller is None:
            return await call_next(ctx)  # the handler answers the refusal
        chain_id = self.chain_id_of(typed)  # raises MCPError (invalid params) when malformed
        begun = await self.runner.begin(ToolCall(name=typed.name, arguments=dict(typed.arguments or {}),
                                                 principal=caller, chain_id=chain_id, trace_id=current_trace_id()))
        if isinstance(begun, CallOutcome):  # refused before its backend (unknown tool, scopes, arguments, rate
            # limit...): no task, the tool error a tools/call would have had
            return self.answer(begun).model_dump(by_alias=True, mode="json", exclude_none=True)
        return {"task": wire_task(begun), "content": []}


def task_handlers(runner: TaskRunner, caller, answer: Callable[[CallOutcome], types.CallToolResult],
                  refuse: Callable[[DomainError, bool], types.CallToolResult]) -> dict[str, tuple[type, Any]]:
    """`tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/list`, for Server.add_request_handler: the caller's
    own tasks only (TaskRunner checks it: scope tools:call and the same subject, or tools:admin except for
    listing).
    `answer` and `refuse` turn an outcome and an error (and whether the tool declares an output schema) into
    the tool result a `tools/call` would have had."""

    def principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
        found: Principal | None = caller(ctx)
        if found is None:
            raise MCPError(types.INVALID_REQUEST, "the request carries no authenticated caller")
        return found

    def invalid(exc: DomainError) -> MCPError:
        return MCPError(types.INVALID_PARAMS, f"{exc.error_type}: {exc.reason}", exc.to_dict())

    async def load(ctx: ServerRequestContext[Any, Any], task_id: str, wait: bool = False,
                   cancel: bool = False) -> dict[str, Any]:
        try:  # the runner checks the scope and that the task is the caller's
            check_task_id(task_id, "taskId")
            if cancel:
                return await runner.cancel_task(principal(ctx), task_id)
            if wait:
                return await runner.wait(principal(ctx), task_id, poll_seconds=0.1)
            return await runner.get(principal(ctx), task_id)
        except DomainError as exc:
            raise invalid(exc) from None

    async def get_task(ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        return wire_task(await load(ctx, params.task_id, wait=False))

    async def task_result(ctx: ServerRequestContext[Any, Any],
                          params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        state = await load(ctx, params.task_id, wait=True)
        schema = bool(state.get("has_output_schema"))
        if state.get("outcome"):
            result = answer(stored_outcome(state["outcome"]))
        elif state["state"] == "cancelled":
            result = refuse(_StoredError({"error_type": "cancelled", "reason": state.get("status_message", ""),
                                          "hint": "call again to retry"}), schema)
        elif state["state"] == "failed":  # ended without an outcome: its replica was lost, or the gateway failed
            lost = bool(state.get("lost"))
            result = refuse(_StoredError({
                "error_type": "task_lost" if lost else "task_failed", "field": "taskId",
                "reason": state.get("status_message", "") or "the task failed before its call ended",
                "retryable": False,
                "hint": "the call may or may not have reached the tool: check it (GetCall, or the tool's status "
                        "tool) before calling again" if lost else "call again to retry"}), schema)
        else:  # still working when the wait ended
            raise MCPError(types.INVALID_REQUEST, f"task_working: task {params.task_id} is still {state['state']}",
                           {"error_type": "task_working", "field": "taskId", "retryable": True,
                            "reason": f"the task is still {state['state']}",
                            "hint": "ask tasks/result again later, or poll tasks/get"})
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        dumped.pop("resultType", None)
        dumped["_meta"] = {**(dumped.get("_meta") or {}), RELATED_TASK: {"taskId": params.task_id}}
        return dumped

    async def cancel_task(ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams) -> dict[str, Any]:
        return wire_task(await load(ctx, params.task_id, cancel=True))

    async def list_tasks(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        try:
            states, cursor = await runner.list(principal(ctx), (params.cursor or "") if params else "")
        except DomainError as exc:  # a malformed cursor: invalid params, as the spec says
            raise invalid(exc) from None
        return {"tasks": [wire_task(state) for state in states], **({"nextCursor": cursor} if cursor else {})}

    return {"tasks/get": (types.GetTaskRequestParams, get_task), "tasks/cancel": (types.CancelTaskRequestParams,
                                                                                 cancel_task),
            "tasks/result": (types.GetTaskPayloadRequestParams, task_result),
            "tasks/list": (types.PaginatedRequestParams, list_tasks)}
