"""`mnemesh tools register`: plain HTTP/JSON APIs as tools, from an OpenAPI 3 document or one URL template.

    mnemesh tools register --openapi shop.yaml [--prefix shop] [--base-url https://api.shop] [--scope shop:read]
    mnemesh tools register weather.forecast --url "GET https://api.weather/forecast/{city}{?days}" \\
        --description "The forecast for a city" [--input-schema '{"type": "object", ...}']

Each tool is registered with RegisterTool, on the gateway's HTTP backend; an operation that cannot be
called that way is listed as skipped with the reason. Prints a line per tool (or --json, one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc
import yaml

from libs.errors import DomainError
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import error_detail
from services.tool_gateway.adapters.mapping import spec_to_proto
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.openapi import ToolsFromOpenApi, template_schema, tools_from_openapi

__all__ = ["add_register_command"]


def _from_args(ns: argparse.Namespace) -> ToolsFromOpenApi:
    scopes = tuple(ns.scope or ())
    if ns.openapi:
        text = Path(ns.openapi).read_text(encoding="utf-8")
        document = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
        return tools_from_openapi(document or {}, prefix=ns.prefix, base_url=ns.base_url, version=ns.version,
                                  scopes=scopes, timeout_seconds=ns.timeout)
    if not (ns.name and ns.url):
        raise SystemExit("give --openapi FILE, or a NAME with --url 'METHOD URL-TEMPLATE'")
    schema = json.loads(ns.input_schema) if ns.input_schema else template_schema(ns.url)
    return ToolsFromOpenApi(tools=[ToolSpec(
        name=ns.name, description=ns.description or f"{ns.url.split('{?')[0]}", input_schema=schema,
        version=ns.version or "1.0.0", scopes=scopes, timeout_seconds=ns.timeout, backend=f"http:{ns.url}")])


def add_register_command(tools, settings_of, run, identity) -> None:
    def command(ns: argparse.Namespace) -> int:
        try:
            found = _from_args(ns)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"error: cannot read the tools to register: {exc}", file=sys.stderr)
            return 1
        except DomainError as exc:
            print(f"error ({exc.error_type}): {exc.field}: {exc.reason}\n  hint: {exc.hint}", file=sys.stderr)
            return 1
        report: dict[str, list] = {"registered": [], "existing": [], "refused": [],
                                   "skipped": [{"operation": s.operation, "reason": s.reason} for s in found.skipped]}

        async def call(ch: grpc.aio.Channel) -> None:
            stub = tools_pb2_grpc.ToolGatewayStub(ch)
            for spec in found.tools:
                try:
                    await stub.RegisterTool(tools_pb2.RegisterToolRequest(tool=spec_to_proto(spec)), timeout=15)
                    report["registered"].append(f"{spec.name} {spec.version}")
                except grpc.aio.AioRpcError as exc:
                    detail = error_detail(exc)
                    if detail is None:
                        raise
                    if detail.error_type == "conflict":
                        report["existing"].append(f"{spec.name} {spec.version}")
                    else:
                        report["refused"].append({"tool": spec.name, "error_type": detail.error_type,
                                                  "field": detail.field, "reason": detail.reason})

        code = run(settings_of(), ns, "tool-gateway", call)
        if ns.json:
            print(json.dumps(report, ensure_ascii=False))
        else:
            lines = [f"registered {t}" for t in report["registered"]] + \
                [f"already registered {t}" for t in report["existing"]] + \
                [f"refused {r['tool']}: {r['field']}: {r['reason']}" for r in report["refused"]] + \
                [f"skipped {s['operation']}: {s['reason']}" for s in report["skipped"]]
            print("\n".join(lines) or "no operations found")
        return code or (1 if report["refused"] else 0)

    p = tools.add_parser("register", help="register HTTP/JSON tools from an OpenAPI 3 document or a URL template")
    p.add_argument("name", nargs="?", default="", help="with --url: the tool's name")
    p.add_argument("--openapi", default="", help="an OpenAPI 3 document (JSON or YAML): one tool per operation")
    p.add_argument("--url", default="", help="'METHOD URL' with {name} placeholders and {?a,b} query names")
    p.add_argument("--description", default="")
    p.add_argument("--input-schema", default="", help="JSON Schema of the arguments (default: from the URL)")
    p.add_argument("--prefix", default="", help="--openapi: names become PREFIX.<operation>")
    p.add_argument("--base-url", default="", help="--openapi: the API's address (default: its first server)")
    p.add_argument("--version", default="", help="default: the document's info.version when x.y.z, else 1.0.0")
    p.add_argument("--scope", action="append", help="a scope callers need (repeatable)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    p.add_argument("--json", action="store_true", help="the report as one JSON line")
    identity(p)
    p.set_defaults(func=command)
