"""`mnemesh memory|tools|adapter|session|chat ...`: talk to a running mesh over gRPC, as a platform team would.

A token comes from MNEMESH_TOKEN, or is minted with the development secret for
--tenant (the default of a local mesh). Failures print the structured error the
service answered with, and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable

import grpc

from libs.auth import issue_token
from libs.config import Settings
from libs.protogen.mnemesh.v1 import (
    common_pb2,
    memory_pb2,
    memory_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from libs.rpc import channel, error_detail
from mnemesh.adapter_cli import add_adapter_commands
from mnemesh.memory_cli import OneLineErrors, add_memory_commands, count_arg, tenant_arg, text_arg
from mnemesh.tools_cli import add_tools_commands
from mnemesh.tools_register_cli import add_register_command
from mnemesh.session_cli import add_session_commands

__all__ = ["add_client_commands"]

LAYERS = {name.removeprefix("MEMORY_LAYER_").lower(): value
          for name, value in common_pb2.MemoryLayer.items() if value}
SOURCES = {name.removeprefix("SOURCE_KIND_").lower(): value
           for name, value in common_pb2.SourceKind.items() if value}


def _token(settings: Settings, ns: argparse.Namespace) -> str:
    return os.environ.get("MNEMESH_TOKEN") or issue_token(settings, subject=ns.user, tenant_id=ns.tenant,
                                                           scopes=["*"], ttl_seconds=600)


def _address(settings: Settings, service: str) -> str:
    return f"{settings.host}:{settings.grpc_port(service)}"


def _run(settings: Settings, ns: argparse.Namespace, service: str,
         call: Callable[[grpc.aio.Channel], Awaitable[None]]) -> int:
    async def go() -> None:
        async with channel(_address(settings, service), _token(settings, ns)) as ch:
            await call(ch)

    try:
        asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        detail = error_detail(exc)
        if detail is not None:
            where = f"{detail.field}: " if detail.field else ""
            hint = f"\n  hint: {detail.hint}" if detail.hint else ""
            print(f"error ({detail.error_type}): {where}{detail.reason}{hint}", file=sys.stderr)
        elif exc.code() == grpc.StatusCode.UNAVAILABLE:
            print(f"cannot reach {service} at {_address(settings, service)}: is the mesh running? "
                  "(`make run`, then `mnemesh status`)", file=sys.stderr)
        else:
            print(f"error ({exc.code().name}): {exc.details()}", file=sys.stderr)
        return 1
    return 0


def memory_search(settings: Settings, ns: argparse.Namespace) -> int:
    async def call(ch: grpc.aio.Channel) -> None:
        reply = await memory_pb2_grpc.RetrieverStub(ch).Search(memory_pb2.SearchRequest(
            tenant=common_pb2.TenantContext(user_id=ns.for_user), query=ns.query, limit=ns.limit,
            layers=[LAYERS[layer] for layer in ns.layer or []], mode=ns.mode, fusion=ns.fusion,
            two_stage=ns.two_stage, tags=ns.tag or [], route=ns.route), timeout=10)
        if ns.json:
            from google.protobuf import json_format

            print(json.dumps(json_format.MessageToDict(reply), ensure_ascii=False))
            return
        if not reply.hits:
            print("no memories match")
        for hit in reply.hits:
            confirm = "  (confirm before use)" if hit.must_confirm else ""
            exact = "  (exact)" if hit.exact else ""
            print(f"{hit.score:.3f}  {hit.memory.memory_id}  {hit.memory.content}{confirm}{exact}")

    return _run(settings, ns, "retriever", call)


def tools_list(settings: Settings, ns: argparse.Namespace) -> int:
    async def call(ch: grpc.aio.Channel) -> None:
        reply = await tools_pb2_grpc.ToolGatewayStub(ch).ListTools(tools_pb2.ListToolsRequest(), timeout=10)
        if not reply.tools:
            print("no tools registered")
        for tool in reply.tools:
            print(f"{tool.name} {tool.version}  {tool.description}")

    return _run(settings, ns, "tool-gateway", call)


def add_client_commands(sub: argparse._SubParsersAction, settings_of: Callable[[], Settings]) -> None:
    def bind(fn):
        return lambda ns: fn(settings_of(), ns)

    def identity(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tenant", default="default", type=tenant_arg,
                       help="tenant of the minted token (default: default)")
        p.add_argument("--user", default="dev", type=text_arg, help="user id (default: dev)")

    memory = sub.add_parser("memory", help="write, read, correct, forget and search memories").add_subparsers(
        dest="verb", required=True, parser_class=OneLineErrors)
    add_memory_commands(memory, _run, settings_of, identity)
    p = memory.add_parser("search", help="search memories of the tenant")
    p.add_argument("query", type=text_arg)
    p.add_argument("--limit", type=count_arg(100, zero_means=10), default=10, help="0 (means 10) to 100")
    p.add_argument("--layer", action="append", choices=list(LAYERS))
    p.add_argument("--for-user", default="", type=text_arg, help="only this user's memories")
    p.add_argument("--mode", default="full", choices=["dense", "sparse", "hybrid", "full"])
    p.add_argument("--fusion", default="", choices=["", "score", "rrf"], help="default: score")
    p.add_argument("--two-stage", action="store_true", help="sparse candidates, then dense re-ranking")
    p.add_argument("--route", default="", choices=["", "semantic", "auto", "structured"],
                   help="auto: the memory router sends entity keys, attribute comparisons and ids to the structured path")
    p.add_argument("--tag", action="append", type=text_arg, help="memories carrying every tag given")
    p.add_argument("--json", action="store_true", help="the reply as one JSON line")
    identity(p)
    p.set_defaults(func=bind(memory_search))

    tools = sub.add_parser("tools", help="the tool registry").add_subparsers(dest="verb", required=True)
    p = tools.add_parser("list", help="list registered tools")
    identity(p)
    p.set_defaults(func=bind(tools_list))
    add_tools_commands(tools, settings_of, _run, identity)
    add_register_command(tools, settings_of, _run, identity)

    add_adapter_commands(sub, settings_of, _run, identity)

    add_session_commands(sub, settings_of, _run, identity)
