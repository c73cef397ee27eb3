"""gRPC ToolGateway: translate only.

CallTool runs the same pipeline as MCP tools/call. A call the pipeline refused before reaching a
backend (unknown tool, scopes, arguments, rate limit, open breaker) fails with its gRPC status
and ErrorDetail; a call that reached its backend and failed there answers OK with `error` set,
`outcome` saying how it ended, like the audit row.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format, struct_pb2

from libs.auth import Principal, current_principal
from libs.errors import DomainError, Unimplemented
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import Registration
from services.tool_gateway.adapters.mapping import (
    rollout_to_proto,
    spec_from_proto,
    spec_to_proto,
    stat_to_proto,
    upstream_from_proto,
    upstream_to_proto,
)
from services.tool_gateway.domain import ToolCall
from services.tool_gateway.domain.experience import note
from services.tool_gateway.entrypoints.calls import current_trace_id
from services.tool_gateway.service_layer import experience, handlers, pipeline, upstreams
from services.tool_gateway.service_layer.tasks import LIST_PAGE, TaskRunner
from services.tool_gateway.service_layer.pipeline import SYSTEM_TENANT, CallPorts
from services.tool_gateway.service_layer.ports import ExperienceStore

__all__ = ["Admin", "registration"]

SCOPES = {"RegisterTool": "tools:admin", "ListTools": "tools:read", "CallTool": "tools:call",
          "RemoveTool": "tools:admin", "GetCall": "tools:call", "GetTask": "tools:call", "CancelTask": "tools:call",
          "ListTasks": "tools:call", "ToolStats": "tools:read",
          "SetCanary": "tools:admin", "Promote": "tools:admin", "Rollback": "tools:admin",
          "AddUpstream": "tools:admin", "RemoveUpstream": "tools:admin", "ListUpstreams": "tools:read"}


@dataclass
class Admin:
    """What the RPCs beyond calls need: experience, and the upstreams added at run time."""

    experience: ExperienceStore
    upstream_store: upstreams.UpstreamStore
    upstreams: upstreams.UpstreamRuntime
    allowed_commands: frozenset[str] = frozenset()
    tasks: TaskRunner | None = None  # calls run as tasks (CallTool as_task, GetTask)


def _tenant(principal: Principal | None) -> str:
    return (principal.tenant_id if principal else "") or SYSTEM_TENANT
_ANONYMOUS = Principal(subject="anonymous", tenant_id="", scopes=frozenset({"*"}))
# Failures that happen at or after the backend: answered in-band (the call ran and is audited).
# Failures at or behind the backend answer in band (the call happened); refusals before it are statuses.
_IN_BAND = frozenset({"backend_error", "backend_fault", "unavailable", "deadline_exceeded", "internal",
                      "result_too_large"})


class ToolGatewayServicer(tools_pb2_grpc.ToolGatewayServicer):
    def __init__(self, ports: CallPorts, admin: Admin) -> None:
        self.ports, self.admin = ports, admin

    async def RegisterTool(self, request, context):
        spec = await handlers.register_tool(spec_from_proto(request.tool), self.ports.registry)
        return tools_pb2.RegisterToolResponse(name=spec.name, version=spec.version)

    async def ListTools(self, request, context):
        specs = await handlers.list_tools(self.ports.registry)
        tools = [spec_to_proto(s) for s in specs]
        if request.with_experience:
            notes = await experience.experience_notes(_tenant(current_principal.get()), [], self.admin.experience)
            for tool in tools:
                if tool.name in notes:
                    tool.description = f"{tool.description} [experience: {note(notes[tool.name])}]"[:4_000]
        return tools_pb2.ListToolsResponse(tools=tools)

    async def RemoveTool(self, request, context):
        return tools_pb2.RemoveToolResponse(versions=await handlers.remove_tool(request.name, request.version,
                                                                                 self.ports.registry))

    async def GetCall(self, request, context):
        state = await handlers.get_call(_tenant(current_principal.get()), request.call_id, self.ports.call_log,
                                        self.ports.results)
        response = tools_pb2.GetCallResponse(state=state.state)
        if state.record is not None:
            r = state.record
            response.call_id, response.tool, response.version, response.outcome = r.call_id, r.tool, r.version, \
                r.outcome
            if r.error:
                response.error.CopyFrom(common_pb2.ErrorDetail(**r.error))
        if state.result is not None:
            response.result.update(state.result)
        return response

    async def GetTask(self, request, context):
        return _task_response(await self._tasks().get(current_principal.get() or _ANONYMOUS, request.task_id))

    async def CancelTask(self, request, context):
        return _task_response(await self._tasks().cancel_task(current_principal.get() or _ANONYMOUS,
                                                              request.task_id))

    async def ListTasks(self, request, context):
        states, cursor = await self._tasks().list(current_principal.get() or _ANONYMOUS, request.cursor,
                                                  limit=request.limit or LIST_PAGE)
        return tools_pb2.ListTasksResponse(tasks=[_task_response(s) for s in states], next_cursor=cursor)

    def _tasks(self) -> TaskRunner:
        if self.admin.tasks is None:
            raise Unimplemented("this gateway runs no tasks", field="as_task", hint="call without as_task")
        return self.admin.tasks

    async def ToolStats(self, request, context):
        stats = await experience.tool_stats(_tenant(current_principal.get()), self.admin.experience, request.name,
                                            request.context)
        return tools_pb2.ToolStatsResponse(stats=[stat_to_proto(s) for s in stats])

    async def SetCanary(self, request, context):
        rollout = await handlers.set_canary(request.name, request.version, self.ports.registry,
                                            percent=request.percent, callers=tuple(request.callers),
                                            max_error_rate_delta=request.max_error_rate_delta,
                                            min_calls=request.min_calls)
        return tools_pb2.RolloutResponse(rollout=rollout_to_proto(rollout))

    async def Promote(self, request, context):
        rollout = await handlers.promote_canary(request.name, self.ports.registry)
        return tools_pb2.RolloutResponse(rollout=rollout_to_proto(rollout))

    async def Rollback(self, request, context):
        rollout = await handlers.roll_back_tool(request.name, request.version, self.ports.registry)
        return tools_pb2.RolloutResponse(rollout=rollout_to_proto(rollout))

    async def AddUpstream(self, request, context):
        config = await upstreams.add_upstream(upstream_from_proto(request.upstream), self.admin.upstream_store,
                                              self.admin.upstreams, self.admin.allowed_commands)
        return tools_pb2.AddUpstreamResponse(name=config.name)

    async def RemoveUpstream(self, request, context):
        await upstreams.remove_upstream(request.name, self.admin.upstream_store, self.admin.upstreams)
        return tools_pb2.RemoveUpstreamResponse(removed=True)

    async def ListUpstreams(self, request, context):
        return tools_pb2.ListUpstreamsResponse(upstreams=[upstream_to_proto(c, s) for c, s in
                                                          upstreams.list_upstreams(self.admin.upstreams)])

    async def CallTool(self, request, context):
        principal = current_principal.get() or _ANONYMOUS
        call = ToolCall(name=request.name, arguments=json_format.MessageToDict(request.arguments),
                        principal=principal, version=request.version, chain_id=request.chain_id,
                        deadline_seconds=request.deadline_seconds, trace_id=current_trace_id(),
                        context=request.context)
        if request.as_task:
            state = await self._tasks().start(call)
            return tools_pb2.CallToolResponse(task_id=state["task_id"], outcome="working")
        outcome = await pipeline.call_tool(call, self.ports)
        response = tools_pb2.CallToolResponse(call_id=outcome.call_id, latency_ms=outcome.latency_ms,
                                              outcome=outcome.outcome, served_by=outcome.served_by,
                                              version=outcome.version, resource_uri=outcome.resource_uri,
                                              replay_of=outcome.replay_of)
        error: DomainError | None = outcome.error
        if error is not None:
            if error.error_type not in _IN_BAND:
                raise error  # the interceptor maps it to its status with the ErrorDetail
            response.error.CopyFrom(common_pb2.ErrorDetail(**error.to_dict()))
            fault = getattr(error, "fault", None)
            if fault:  # the backend's own fault (SOAP code, detail), kept beside the structured error
                response.fault.update(fault)
            return response
        assert outcome.result is not None
        result = struct_pb2.Struct()
        result.update(outcome.result.value)
        response.result.CopyFrom(result)
        response.truncated = outcome.result.truncated
        return response


def _task_response(state: dict) -> tools_pb2.GetTaskResponse:
    response = tools_pb2.GetTaskResponse(task_id=state["task_id"], state=state["state"], tool=state["tool"],
                                         created_at=state["created_at"], updated_at=state["updated_at"],
                                         status_message=state.get("status_message", ""))
    if state.get("outcome"):
        response.call.CopyFrom(_stored_response(state["outcome"]))
    return response


def _stored_response(d: dict) -> tools_pb2.CallToolResponse:
    """The CallTool answer of a call a task ran, from its stored outcome (tasks.outcome_to_dict)."""
    response = tools_pb2.CallToolResponse(call_id=d["call_id"], latency_ms=d["latency_ms"], outcome=d["outcome"],
                                          served_by=d["served_by"], version=d["version"],
                                          resource_uri=d["resource_uri"], replay_of=d.get("replay_of", ""),
                                          truncated=d["truncated"])
    if d.get("error"):
        error = dict(d["error"])
        fault = error.pop("fault", None)
        response.error.CopyFrom(common_pb2.ErrorDetail(**error))
        if fault:
            response.fault.update(fault)
    elif d.get("result") is not None:
        response.result.update(d["result"])
    return response


def registration(ports: CallPorts, admin: Admin) -> Registration:
    return Registration(tools_pb2_grpc.add_ToolGatewayServicer_to_server, ToolGatewayServicer(ports, admin),
                        "mnemesh.v1.ToolGateway", SCOPES)
