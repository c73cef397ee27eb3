"""`mnemesh adapter import-wsdl|list|describe|invoke|drop`: the adapter over gRPC, as an operator would use it."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import json_format

from libs.config import Settings
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc

__all__ = ["add_adapter_commands", "companions"]

_LOCATION = re.compile(rb'(?:schemaLocation|location)\s*=\s*["\']([^"\']+)["\']')


def companions(main: Path, limit: int = 200) -> dict[str, bytes]:
    """The files a local WSDL imports or includes by relative location, recursively, by absolute file URI."""
    found: dict[str, bytes] = {}
    pending = [main.resolve()]
    while pending and len(found) < limit:
        path = pending.pop()
        if path.as_uri() in found or not path.is_file():
            continue
        found[path.as_uri()] = content = path.read_bytes()
        for match in _LOCATION.finditer(content):
            location = match.group(1).decode(errors="replace")
            if "://" not in location and not location.startswith("urn:"):
                pending.append((path.parent / location).resolve())
    return found


def _print_backend(backend: tools_pb2.Backend) -> None:
    port = backend.port
    print(f"{backend.backend_id}  {port.service}/{port.port} SOAP {port.soap_version}  {port.address}  "
          f"revision {backend.revision}  wsdl {backend.wsdl_hash[:12]}")
    for tool in backend.tools:
        print(f"  {tool.name}  {tool.version}  {tool.description[:90]}")
    for failed in backend.failed:
        print(f"  not mapped: {failed.operation}: {failed.reason}")
    for note in backend.notes:
        print(f"  note: {note}")


def add_adapter_commands(sub: argparse._SubParsersAction, settings_of: Callable[[], Settings],
                         run, identity) -> None:
    adapter = sub.add_parser("adapter", help="legacy SOAP backends as tools").add_subparsers(dest="verb",
                                                                                            required=True)

    def rpc(call):
        def handler(ns: argparse.Namespace) -> int:
            async def go(ch: grpc.aio.Channel) -> None:
                await call(tools_pb2_grpc.AdapterStub(ch), ns)

            return run(settings_of(), ns, "adapter", go)

        return handler

    async def import_wsdl(stub, ns) -> None:
        options = tools_pb2.ImportOptions(service=ns.service, port=ns.port, address=ns.address,
                                          allow_remote=ns.allow_remote, credentials=ns.credentials,
                                          timeout_seconds=ns.timeout, retries=ns.retries)
        request = tools_pb2.ImportWsdlRequest(backend_id=ns.backend_id, options=options)
        if ns.file:
            main = Path(ns.file).resolve()
            files = companions(main)
            request.document = files.pop(main.as_uri())
            request.base_url = main.as_uri()
            request.documents.update(files)
        elif ns.path:
            request.path = ns.path
        else:
            request.url = ns.url
        reply = await stub.ImportWsdl(request, timeout=120)
        _print_backend(reply.backend)
        if not reply.registered:
            print(f"  not registered with the tool-gateway: {reply.registration_error}")

    async def list_backends(stub, ns) -> None:
        for backend in (await stub.ListBackends(tools_pb2.ListBackendsRequest(), timeout=10)).backends:
            _print_backend(backend)

    async def describe(stub, ns) -> None:
        backend = (await stub.Describe(tools_pb2.DescribeRequest(backend_id=ns.backend_id), timeout=30)).backend
        if ns.json:
            print(json_format.MessageToJson(backend))
        else:
            _print_backend(backend)

    async def invoke(stub, ns) -> None:
        request = tools_pb2.InvokeRequest(backend_id=ns.backend_id, operation=ns.operation)
        request.arguments.update(json.loads(ns.arguments))
        reply = await stub.Invoke(request, timeout=ns.timeout + 5)
        print(json.dumps(json_format.MessageToDict(reply), ensure_ascii=False, indent=2))

    async def drop(stub, ns) -> None:
        reply = await stub.Drop(tools_pb2.DropRequest(backend_id=ns.backend_id), timeout=30)
        print(f"dropped {len(reply.tools)} tool(s)" + (f"; {reply.unregister_error}" if reply.unregister_error else ""))

    p = adapter.add_parser("import-wsdl", help="turn a WSDL's operations into tools")
    p.add_argument("backend_id", help="namespaces the tools, e.g. billing -> billing.get_invoice")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--url")
    source.add_argument("--file", help="a local WSDL; files it imports by relative location are sent with it")
    source.add_argument("--path", help="a WSDL on the adapter's host, under MNEMESH_ADAPTER_WSDL_DIR")
    p.add_argument("--service", default="")
    p.add_argument("--port", default="")
    p.add_argument("--address", default="", help="endpoint URL instead of the WSDL's soap:address")
    p.add_argument("--credentials", default="", help="a name in MNEMESH_ADAPTER_CREDENTIALS")
    p.add_argument("--allow-remote", action="store_true", help="fetch imports from other hosts")
    p.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    p.add_argument("--retries", type=int, default=0)
    identity(p)
    p.set_defaults(func=rpc(import_wsdl))
    p = adapter.add_parser("list", help="imported and configured backends")
    identity(p)
    p.set_defaults(func=rpc(list_backends))
    p = adapter.add_parser("describe", help="the tools of one backend")
    p.add_argument("backend_id")
    p.add_argument("--json", action="store_true", help="with the full schemas")
    identity(p)
    p.set_defaults(func=rpc(describe))
    p = adapter.add_parser("invoke", help="call one operation with JSON arguments")
    p.add_argument("backend_id")
    p.add_argument("operation")
    p.add_argument("arguments", nargs="?", default="{}", help='JSON object, e.g. \'{"customer_id": 2}\'')
    p.add_argument("--timeout", type=float, default=30.0)
    identity(p)
    p.set_defaults(func=rpc(invoke))
    p = adapter.add_parser("drop", help="remove an imported backend and its tools")
    p.add_argument("backend_id")
    identity(p)
    p.set_defaults(func=rpc(drop))
