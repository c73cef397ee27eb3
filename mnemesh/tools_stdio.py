"""`mnemesh tools serve-stdio`: the tool-gateway's MCP server on stdin/stdout, for local MCP clients.

A client configures it as a stdio server, e.g. `{"command": "mnemesh", "args": ["tools", "serve-stdio"],
"env": {"MNEMESH_TOKEN": "<jwt>"}}`. The process is a gateway replica of its own (same PostgreSQL,
Redis and config file; its gRPC port is a free one, its metrics are off) serving one caller.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

__all__ = ["add_serve_stdio"]


def _serve_stdio(settings_of, ns: argparse.Namespace) -> int:
    from libs.config import ConfigError
    from libs.errors import DomainError
    from libs.eventloop import run
    from libs.rpc import PortInUse
    from libs.runtime import InfrastructureError, run_service
    from libs.telemetry import shutdown_telemetry
    from mnemesh.infra import free_port
    from services.tool_gateway import bootstrap
    from services.tool_gateway.entrypoints.mcp_server import LIST_SCOPE
    from services.tool_gateway.entrypoints.mcp_stdio import principal_of

    settings = settings_of()
    try:
        principal = principal_of(settings, ns.token or os.environ.get("MNEMESH_TOKEN", ""), LIST_SCOPE)
    except DomainError as exc:
        print(f"mnemesh tools serve-stdio: {exc.reason}" + (f"\n  hint: {exc.hint}" if exc.hint else ""),
              file=sys.stderr)
        return 2
    settings = settings.model_copy(update={"metrics_enabled": False, "tool_gateway_grpc_port": free_port()})
    try:
        run(run_service(bootstrap.NAME, settings, functools.partial(bootstrap.bootstrap, stdio_principal=principal),
                        migrations_package=bootstrap.MIGRATIONS), settings.event_loop)
    except (InfrastructureError, ConfigError, PortInUse) as exc:
        print(f"mnemesh tools serve-stdio: {exc}", file=sys.stderr)
        return 2
    finally:
        shutdown_telemetry()
    return 0


def add_serve_stdio(tools, settings_of) -> None:
    p = tools.add_parser("serve-stdio", help="serve the gateway's MCP on stdin/stdout for a local client")
    p.add_argument("--token", default="", help="the caller's JWT (default: MNEMESH_TOKEN)")
    p.set_defaults(func=functools.partial(_serve_stdio, settings_of))
