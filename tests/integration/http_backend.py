"""A small real HTTP/JSON backend for the gateway's tests, on a free loopback port.

It counts its calls per path, can be told to fail (`/flaky` fails its first N calls with 503),
to hang (`/hang` never answers until released), and answers big results (`/big`). `/orders`
answers what it received (query and JSON body); `openapi_document` describes the backend as an
OpenAPI 3.0 document, as teams publish theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from libs.http import serve_asgi
from mnemesh.infra import free_port

__all__ = ["HttpBackend", "http_backend", "openapi_document"]


@dataclass
class HttpBackend:
    port: int
    calls: Counter = field(default_factory=Counter)
    fail_first: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    down: bool = False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def app_for(state: HttpBackend) -> Starlette:
    async def customer(request: Request) -> JSONResponse:
        state.calls["customer"] += 1
        cid = request.path_params["cid"]
        if cid == "missing":
            return JSONResponse({"message": "no customer with that id", "trace": "internal-detail"}, 404)
        return JSONResponse({"id": cid, "name": "Li Wei", "vip": request.query_params.get("vip"),
                             "_links": {"self": f"/customers/{cid}"}, "fax": None})

    async def flaky(request: Request) -> JSONResponse:
        state.calls["flaky"] += 1
        if state.down or state.calls["flaky"] <= state.fail_first:
            return JSONResponse({"error": "overloaded"}, 503)
        return JSONResponse({"ok": True, "body": await request.json()})

    async def hang(request: Request) -> JSONResponse:
        state.calls["hang"] += 1
        await state.release.wait()
        return JSONResponse({"late": True})

    async def big(request: Request) -> JSONResponse:
        state.calls["big"] += 1
        return JSONResponse({"rows": [{"n": i, "text": "lorem ipsum " * 4} for i in range(500)]})

    async def fallback(request: Request) -> JSONResponse:
        state.calls["fallback"] += 1
        return JSONResponse({"sent_by": "sms"})

    async def orders(request: Request) -> JSONResponse:
        state.calls["orders"] += 1
        return JSONResponse({"query": dict(request.query_params), "body": await request.json()}, 201)

    return Starlette(routes=[Route("/orders", orders, methods=["POST"]), Route("/customers/{cid}", customer), Route("/flaky", flaky, methods=["POST"]),
                             Route("/hang", hang, methods=["POST"]), Route("/big", big),
                             Route("/sms", fallback, methods=["POST"])])


@contextlib.asynccontextmanager
async def serving(app, state, probe: str, name: str, method: str = "GET") -> AsyncIterator[None]:
    """Serve `app` on `state.port` until the block ends, once `probe` answers; `state.calls` starts empty and
    `state.release` is set at the end (so handlers holding a call let go)."""
    task = asyncio.create_task(serve_asgi(app, host="127.0.0.1", port=state.port, port_setting=name))
    async with httpx2.AsyncClient(timeout=2) as http:
        with anyio.fail_after(20):
            while True:
                try:
                    await http.request(method, state.url(probe), json={} if method == "POST" else None)
                    break
                except httpx2.TransportError:
                    await anyio.sleep(0.05)
    state.calls.clear()
    try:
        yield
    finally:
        state.release.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def http_backend() -> AsyncIterator[HttpBackend]:
    state = HttpBackend(free_port())
    async with serving(app_for(state), state, "/big", "test backend"):
        yield state


def openapi_document(base_url: str) -> dict:
    """This backend as an OpenAPI 3.0 document: $refs, 3.0 keywords, and two operations no tool can call."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "2.1.0"},
        "servers": [{"url": base_url}],
        "paths": {
            "/customers/{customer-id}": {
                "parameters": [{"$ref": "#/components/parameters/CustomerId"}],
                "get": {"operationId": "getCustomer", "summary": "Read one customer by id",
                        "parameters": [{"name": "vip", "in": "query", "schema": {"type": "boolean"}}],
                        "responses": {"200": {"description": "the customer"}}},
            },
            "/orders": {
                "post": {"operationId": "createOrder", "summary": "Place an order",
                         "parameters": [{"name": "dry-run", "in": "query", "schema": {"type": "boolean"}}],
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"$ref": "#/components/schemas/Order"}}}},
                         "responses": {"201": {"description": "placed"}}},
                "put": {"operationId": "replaceOrders", "summary": "Replace every order",
                        "requestBody": {"required": True, "content": {"application/json": {
                            "schema": {"type": "array", "items": {"$ref": "#/components/schemas/Order"}}}}},
                        "responses": {"200": {"description": "replaced"}}},
            },
            "/audit": {
                "get": {"operationId": "readAudit", "summary": "Needs a header the gateway cannot send",
                        "parameters": [{"name": "X-Auditor", "in": "header", "required": True,
                                        "schema": {"type": "string"}}],
                        "responses": {"200": {"description": "the audit"}}},
            },
        },
        "components": {
            "parameters": {"CustomerId": {"name": "customer-id", "in": "path", "required": True,
                                          "schema": {"type": "string", "minLength": 1}}},
            "schemas": {"Order": {"type": "object", "required": ["item", "quantity"], "properties": {
                "item": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
                "note": {"type": "string", "nullable": True}}}},
        },
    }
