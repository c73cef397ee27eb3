"""An ASGI app served by uvicorn inside a service's event loop, as one of its background tasks.

The task serves until it is cancelled (run_service cancels its tasks at stop); then it stops
accepting, lets requests in flight finish within a bound, runs the app's lifespan shutdown and
returns, so the service still stops within its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from libs.logs import get_logger
from libs.rpc import PortInUse

__all__ = ["serve_asgi"]

log = get_logger(__name__)

try:  # uvicorn's C parser of HTTP/1.1 (llhttp); h11, in pure Python, when it is not installed
    import httptools  # noqa: F401
    _HTTP = "httptools"
except ImportError:
    _HTTP = "h11"


class _InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The service owns SIGTERM/SIGINT (libs/runtime.py). uvicorn would install handlers of its
        # own and, once stopped, raise the signal again: with the service's handlers gone by then,
        # that would kill the process in the middle of its orderly stop.
        yield


def _listen(host: str, port: int, port_setting: str) -> socket.socket:
    """Bind before uvicorn does: its own bind failure exits the whole process (sys.exit)."""
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto says
    # TCP, and accepted sockets inherit it. With Nagle on, a response written in two parts (headers,
    # then body) waits for the client's delayed ACK: about 40 ms per request on a kept-alive connection.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # SO_REUSEADDR lets a restarted service rebind past TIME_WAIT; a second listener still fails.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}; stop what holds the port, "
                        f"or set {port_setting} to a free port") from None
    return sock


async def serve_asgi(app: ASGIApp, *, host: str, port: int, port_setting: str,
                     drain_seconds: float = 1.0) -> None:
    """Serve `app` on host:port until cancelled; PortInUse names `port_setting` when the port is taken."""
    sock = _listen(host, port, port_setting)
    # log_config=None keeps the service's JSON logging; the app logs its own requests.
    # http: httptools (llhttp, in C) when installed, h11 otherwise (see _HTTP).
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_config=None, access_log=False,
                            http=_HTTP, timeout_graceful_shutdown=drain_seconds)
    server = _InLoopServer(config)

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process when the app's lifespan startup fails
            raise RuntimeError(f"the HTTP server on {host}:{port} did not start "
                               f"(uvicorn exit code {exc.code}); see the log above") from None

    serving = asyncio.ensure_future(serve())
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        # Shielded, so that cancelling this task asks uvicorn to stop instead of abandoning it
        # half-way (listener open, lifespan never shut down).
        server.should_exit = True
        await serving
        raise
    finally:
        sock.close()
        log.info("http server stopped", address=f"{host}:{port}")
