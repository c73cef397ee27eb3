"""The `mnemesh` command: run the mesh, serve one service, inspect, and talk to it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from libs.config import SERVICES, ConfigError, Settings, load_settings

__all__ = ["main"]


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        print(f"mnemesh: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_run(ns: argparse.Namespace) -> int:
    from libs.auth import refuse_published_secret
    from mnemesh.supervisor import run_mesh

    if ns.dev:
        os.environ["MNEMESH_DEV_MODE"] = "true"  # the services the supervisor starts inherit it
    settings = _settings()
    try:
        refuse_published_secret(settings)
    except ValueError as exc:
        print(f"mnemesh run: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run_mesh(settings))


def cmd_serve(ns: argparse.Namespace) -> int:
    from libs.eventloop import run
    from libs.rpc import PortInUse
    from libs.runtime import InfrastructureError, run_service
    from libs.telemetry import MetricsPortInUse, shutdown_telemetry
    from mnemesh.registry import load_bootstrap

    settings = _settings()
    wiring = load_bootstrap(ns.service)
    try:
        run(run_service(ns.service, settings, wiring.bootstrap, migrations_package=wiring.migrations), settings.event_loop)
    except (InfrastructureError, ConfigError, PortInUse, MetricsPortInUse) as exc:
        print(f"mnemesh serve {ns.service}: {exc}", file=sys.stderr)
        return 2
    finally:
        shutdown_telemetry()
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    from mnemesh.supervisor import check_health, print_table, status_file

    settings = _settings()
    path = status_file(settings)
    if not path.exists():
        print(f"the mesh is not running (no {path}); start it with `make run` (or `mnemesh run`)")
        return 1
    status = json.loads(path.read_text())

    async def probe() -> list[bool]:
        return await asyncio.gather(*(check_health(s["grpc"]) for s in status["services"].values()))

    health = asyncio.run(probe())
    rows = [(name, s["grpc"], "SERVING" if ok else "NOT SERVING", s["metrics"], s["log"])
            for (name, s), ok in zip(status["services"].items(), health, strict=True)]
    print_table(rows, ("service", "gRPC", "health", "metrics", "log"))
    if "mcp" in status:
        print(f"  MCP for agents (tool-gateway): {status['mcp']}")
    dependencies = status.get("dependencies", {})
    if dependencies:
        print()
        print_table([dependency_row(name, d) for name, d in dependencies.items()],
                    ("dependency", "where", "health", "process"))
    print(f"  qdrant: {status['infrastructure']['qdrant']}")
    return 0 if all(health) and all(d["reachable"] for d in dependencies.values()) else 1


def dependency_row(name: str, dep: dict) -> tuple[str, str, str, str]:
    """One line of `mnemesh status` for Redis or PostgreSQL, as the supervisor last probed it."""
    import time

    age = f" ({time.time() - dep['checked_at']:.0f} s ago)" if dep.get("checked_at") else ""
    health = ("reachable" if dep["reachable"] else f"UNREACHABLE: {dep['problem']}") + age
    if not dep.get("embedded"):
        process = "configured"
    else:
        process = (f"embedded, pid {dep['pid']}" if dep["running"] else "embedded, restarting") + \
            (f", restarted {dep['restarts']}x" if dep["restarts"] else "")
    return name, dep["url"], health, process


def cmd_health(ns: argparse.Namespace) -> int:
    from mnemesh.supervisor import check_health

    settings = _settings()
    address = ns.address or f"{settings.host}:{settings.grpc_port(ns.service)}"
    ok = asyncio.run(check_health(address, timeout=ns.timeout))
    print(f"{ns.service} at {address}: {'SERVING' if ok else 'NOT SERVING'}")
    return 0 if ok else 1


def cmd_token(ns: argparse.Namespace) -> int:
    from libs.auth import issue_token
    from libs.events.producers import produce_scope
    from libs.events.schema import STREAMS

    scopes = list(ns.scope or [])
    if ns.producer:
        external = sorted(name for name, stream in STREAMS.items() if stream.external)
        if ns.producer not in external:
            print(f"mnemesh token: --producer {ns.producer!r} is not a stream producers publish to; "
                  f"use one of {', '.join(external)}", file=sys.stderr)
            return 2
        scopes.append(produce_scope(ns.producer))
    try:
        print(issue_token(_settings(), subject=ns.subject, tenant_id=ns.tenant, scopes=scopes or ["*"],
                          ttl_seconds=ns.ttl))
    except ValueError as exc:
        print(f"mnemesh token: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_asyncapi(ns: argparse.Namespace) -> int:
    from libs.events.asyncapi import render

    text = render()
    if ns.output == "-":
        sys.stdout.write(text)
    else:
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {ns.output}")
    return 0


def cmd_bench(ns: argparse.Namespace) -> int:
    from mnemesh.bench import run_benchmark

    return asyncio.run(run_benchmark(ns.name, _settings(), repetitions=ns.repetitions, warmup=ns.warmup,
                                     memories=ns.memories, n=ns.n, batch=ns.batch, seconds=ns.seconds))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnemesh", description="Mnemesh: memory and tools for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="boot the whole mesh (embedded infrastructure unless configured)")
    p.add_argument("--dev", action="store_true",
                   help="development mode (MNEMESH_DEV_MODE=true): allows the published default JWT secret")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", help="run one service in the foreground")
    p.add_argument("service", choices=list(SERVICES))
    p.set_defaults(func=cmd_serve)

    sub.add_parser("status", help="show the running mesh and its health").set_defaults(func=cmd_status)

    p = sub.add_parser("health", help="gRPC health check of one service; exit 0 when SERVING")
    p.add_argument("--service", choices=list(SERVICES), required=True)
    p.add_argument("--address", help="host:port (default: the service's configured port)")
    p.add_argument("--timeout", type=float, default=3.0)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("token", help="print a development JWT (HS256, MNEMESH_JWT_SECRET)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--subject", default="dev")
    p.add_argument("--scope", action="append", help="repeat for several; default '*'")
    p.add_argument("--producer", nargs="?", const="mnemesh.memory.commands", metavar="STREAM",
                   help="a producer token: adds the scope produce:STREAM (default mnemesh.memory.commands)")
    p.add_argument("--ttl", type=int, default=3600, help="seconds")
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("asyncapi", help="print or write the AsyncAPI document of every stream")
    p.add_argument("--output", "-o", default="-")
    p.set_defaults(func=cmd_asyncapi)

    from mnemesh.client_cli import add_client_commands

    add_client_commands(sub, _settings)

    from services.retriever.evaluation.cli import add_eval_commands

    add_eval_commands(sub)

    from mnemesh.index_cli import add_index_commands

    add_index_commands(sub, _settings)

    p = sub.add_parser("bench", help="run a benchmark against its baseline and print ratios")
    p.add_argument("name", help="eventstore, bus, adapter, search, sessions, tools, write or list")
    p.add_argument("--n", type=int, default=20_000, help="write: memories per path")
    p.add_argument("--batch", type=int, default=200, help="write: batch size (stream read, WriteBatch, baseline)")
    p.add_argument("--repetitions", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--memories", help="search: memories loaded, comma-separated sizes (default 10000,100000)")
    p.add_argument("--seconds", type=float, help="sessions: how long the device writers run (default 30)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except KeyboardInterrupt:
        return 130
