"""`mnemesh tools call|task|tasks|stats|canary|promote|rollback|remove|upstream ...`: calls and the tool-gateway's
administration.

Every command prints a line per item, or with --json the reply as one JSON line.
"""

from __future__ import annotations

import argparse
import json

import grpc
from google.protobuf import json_format

from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc

__all__ = ["add_tools_commands"]


def _print(reply, ns: argparse.Namespace, lines) -> None:
    if ns.json:
        print(json.dumps(json_format.MessageToDict(reply, preserving_proto_field_name=True), ensure_ascii=False))
        return
    for line in lines(reply):
        print(line)


def _rollout(r: tools_pb2.Rollout) -> list[str]:
    canary = f", canary {r.canary} ({r.percent:g} %{' + ' + ','.join(r.callers) if r.callers else ''})" \
        if r.canary else ""
    return [f"{r.name}: {r.state}, stable {r.stable or '(highest)'}{canary}" + (f" — {r.reason}" if r.reason else "")]


def _call(r: tools_pb2.CallToolResponse) -> list[str]:
    if r.task_id:
        return [f"task {r.task_id} started (mnemesh tools task {r.task_id})"]
    head = f"{r.outcome} {r.call_id}" + (f" (replay of {r.replay_of})" if r.replay_of else "") + \
        (f", served by {r.served_by} {r.version}" if r.served_by else "")
    if r.HasField("error"):
        return [head, f"{r.error.error_type} {r.error.field}: {r.error.reason}" + (f" ({r.error.hint})" if r.error.hint
                                                                                   else "")]
    return [head, json.dumps(json_format.MessageToDict(r.result), ensure_ascii=False)]


def _task(r: tools_pb2.GetTaskResponse) -> list[str]:
    lines = [f"task {r.task_id} ({r.tool}): {r.state} — {r.status_message} (updated {r.updated_at})"]
    return lines + (_call(r.call) if r.HasField("call") else [])


def _tasks(r: tools_pb2.ListTasksResponse) -> list[str]:
    lines = [f"task {t.task_id} ({t.tool}): {t.state} — {t.status_message} (started {t.created_at})" for t in r.tasks]
    return (lines or ["no tasks"]) + ([f"more: mnemesh tools tasks --cursor {r.next_cursor}"] if r.next_cursor else [])


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"--args: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise SystemExit("--args: must be a JSON object")
    return value


def add_tools_commands(tools, settings_of, run, identity) -> None:
    """Add the administration verbs to the `tools` sub-parsers (`run` and `identity` from client_cli)."""

    def rpc(method: str, request_of, lines):
        def command(ns: argparse.Namespace) -> int:
            async def call(ch: grpc.aio.Channel) -> None:
                reply = await getattr(tools_pb2_grpc.ToolGatewayStub(ch), method)(request_of(ns), timeout=15)
                _print(reply, ns, lines)
            return run(settings_of(), ns, "tool-gateway", call)
        return command

    def parser(sub, name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="the reply as one JSON line")
        identity(p)
        p.set_defaults(func=func)
        return p

    def call_request(ns: argparse.Namespace) -> tools_pb2.CallToolRequest:
        request = tools_pb2.CallToolRequest(name=ns.name, version=ns.version, chain_id=ns.chain_id, as_task=ns.task,
                                            deadline_seconds=ns.deadline, context=ns.context)
        request.arguments.update(_arguments(ns.args))
        return request

    p = parser(tools, "call", "call a tool through the gateway's pipeline", rpc("CallTool", call_request, _call))
    p.add_argument("name")
    p.add_argument("--args", default="{}", help="the arguments, a JSON object")
    p.add_argument("--version", default="")
    p.add_argument("--chain-id", default="", help="a step of this chain (requires, resume)")
    p.add_argument("--task", action="store_true", help="answer a task id at once (poll: mnemesh tools task ID)")
    p.add_argument("--deadline", type=float, default=0.0, help="seconds (default: the tool's timeout)")
    p.add_argument("--context", default="", help="the task kind, for experience")
    get_task = rpc("GetTask", lambda ns: tools_pb2.GetTaskRequest(task_id=ns.task_id), _task)
    cancel_task = rpc("CancelTask", lambda ns: tools_pb2.CancelTaskRequest(task_id=ns.task_id), _task)
    p = parser(tools, "task", "the state of a call run as a task (--cancel: cancel it)",
               lambda ns: (cancel_task if ns.cancel else get_task)(ns))
    p.add_argument("task_id")
    p.add_argument("--cancel", action="store_true", help="cancel the task, whichever replica runs it")
    p = parser(tools, "tasks", "your calls run as tasks, oldest first, a page at a time", rpc(
        "ListTasks", lambda ns: tools_pb2.ListTasksRequest(cursor=ns.cursor, limit=ns.limit), _tasks))
    p.add_argument("--cursor", default="", help="go on from the page that printed this cursor")
    p.add_argument("--limit", type=int, default=0, help="tasks per page, 1-50 (default 50)")
    p = parser(tools, "stats", "how tools have fared (procedural memory)", rpc(
        "ToolStats", lambda ns: tools_pb2.ToolStatsRequest(name=ns.name, context=ns.context),
        lambda r: [f"{s.name}: {s.note or 'no calls yet'}" for s in r.stats] or ["no experience yet"]))
    p.add_argument("name", nargs="?", default="")
    p.add_argument("--context", default="", help="the task kind callers declare")
    p = parser(tools, "canary", "send a share of callers to a version", rpc(
        "SetCanary", lambda ns: tools_pb2.SetCanaryRequest(
            name=ns.name, version=ns.version, percent=ns.percent, callers=ns.caller or [],
            max_error_rate_delta=ns.max_error_rate_delta, min_calls=ns.min_calls), lambda r: _rollout(r.rollout)))
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("--percent", type=float, default=0.0)
    p.add_argument("--caller", action="append", help="a caller (token subject) always sent to the canary")
    p.add_argument("--max-error-rate-delta", type=float, default=0.0, help="default 0.2")
    p.add_argument("--min-calls", type=int, default=0, help="default 20")
    p = parser(tools, "promote", "make the canary the stable version", rpc(
        "Promote", lambda ns: tools_pb2.PromoteRequest(name=ns.name), lambda r: _rollout(r.rollout)))
    p.add_argument("name")
    p = parser(tools, "rollback", "stop the canary, or pin the stable version", rpc(
        "Rollback", lambda ns: tools_pb2.RollbackRequest(name=ns.name, version=ns.version),
        lambda r: _rollout(r.rollout)))
    p.add_argument("name")
    p.add_argument("version", nargs="?", default="")
    p = parser(tools, "remove", "remove a tool (one version, or all)", rpc(
        "RemoveTool", lambda ns: tools_pb2.RemoveToolRequest(name=ns.name, version=ns.version),
        lambda r: [f"removed {v}" for v in r.versions]))
    p.add_argument("name")
    p.add_argument("version", nargs="?", default="")

    upstream = tools.add_parser("upstream", help="federated upstream MCP servers").add_subparsers(
        dest="upstream_verb", required=True)
    p = parser(upstream, "add", "add an upstream (stdio command after --, or --url)", rpc(
        "AddUpstream", lambda ns: tools_pb2.AddUpstreamRequest(upstream=tools_pb2.Upstream(
            name=ns.name, command=[c for c in ns.command if c != "--"], url=ns.url, prefix=ns.prefix,
            no_prefix=ns.no_prefix, scopes=ns.scope or [], timeout_seconds=ns.timeout)),
        lambda r: [f"added {r.name}"]))
    p.add_argument("name")
    p.add_argument("--url", default="")
    p.add_argument("--prefix", default="", help="default: the name")
    p.add_argument("--no-prefix", action="store_true")
    p.add_argument("--scope", action="append", help="scopes a caller needs for its tools")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the stdio command line")
    p = parser(upstream, "list", "list upstreams and their state", rpc(
        "ListUpstreams", lambda ns: tools_pb2.ListUpstreamsRequest(),
        lambda r: [f"{u.upstream.name}: {u.state}, {u.tools} tools, {u.restarts} restarts"
                   + (f" ({u.reason})" if u.reason else "") for u in r.upstreams] or ["no upstreams"]))
    p = parser(upstream, "remove", "remove an upstream added at run time", rpc(
        "RemoveUpstream", lambda ns: tools_pb2.RemoveUpstreamRequest(name=ns.name), lambda r: ["removed"]))
    p.add_argument("name")

    from mnemesh.tools_stdio import add_serve_stdio

    add_serve_stdio(tools, settings_of)
