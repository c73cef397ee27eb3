"""The adapter's HTTP exchange (`SoapHttp`) against a local HTTP server: replies, failures, redirects, proxies."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import web

from mnemesh.infra import free_port
from services.adapter.adapters import soap_http
from services.adapter.adapters.soap_http import HttpTimeout, HttpUnreachable, SoapHttp


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    auth = request.headers.get("Authorization", "")
    return web.Response(body=body, status=200, headers={"Content-Type": "text/xml; charset=iso-8859-1",
                                                        "X-Auth": auth, "X-Action": request.headers["SOAPAction"]})


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(2)
    return web.Response(text="late")


async def _moved(request: web.Request) -> web.Response:
    raise web.HTTPFound("/echo")


async def test_a_post_returns_the_whole_reply_with_status_headers_and_charset() -> None:
    app = web.Application()
    app.router.add_post("/echo", _echo)
    app.router.add_post("/slow", _slow)
    app.router.add_post("/moved", _moved)
    runner, base = await _serve(app)
    http = SoapHttp(max_connections=4)
    try:
        reply = await http.post(f"{base}/echo", b"<a/>", {"SOAPAction": '"ping"', "Content-Type": "text/xml"},
                                auth=("clerk", "s3cret"), timeout=5)
        assert (reply.status, reply.content, reply.encoding) == (200, b"<a/>", "iso-8859-1")
        assert reply.headers["content-type"].startswith("text/xml")  # case-insensitive lookups
        assert reply.headers["X-Auth"] == "Basic " + base64.b64encode(b"clerk:s3cret").decode()
        assert reply.headers["X-Action"] == '"ping"'
        moved = await http.post(f"{base}/moved", b"<a/>", {}, auth=None, timeout=5)
        assert moved.status == 302  # not followed: the envelope is not sent on to another address
        with pytest.raises(HttpTimeout):
            await http.post(f"{base}/slow", b"<a/>", {}, auth=None, timeout=0.3)
    finally:
        await http.aclose()
        await runner.cleanup()
    http = SoapHttp()
    with pytest.raises(HttpUnreachable) as err:  # the server is gone: refused
        await http.post(f"{base}/echo", b"<a/>", {}, auth=None, timeout=5)
    await http.aclose()
    assert "Connect" in str(err.value)


def test_the_proxy_comes_from_the_environment_and_no_proxy_is_honoured(monkeypatch) -> None:
    soap_http._proxy.cache_clear()
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "erp.internal,127.0.0.1")
    try:
        assert soap_http._proxy("http://soap.example/service") == "http://proxy.example:3128"
        assert soap_http._proxy("http://erp.internal/service") is None
        assert soap_http._proxy("https://soap.example/service") is None  # no HTTPS proxy set
    finally:
        soap_http._proxy.cache_clear()
