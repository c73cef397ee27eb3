"""A minimal HTTP/1.1 client for POSTs to one origin, on kept-alive asyncio connections.

For the gateway's hottest outbound request, a tools/call to a Streamable HTTP upstream
(upstream_http.py). A general client (httpx) spends about a millisecond of CPU on such a POST in
layers this one request does not need (auth and redirect handling, event hooks, a connection pool
with its own locking, a response model); this one writes the request in one write and reads the
answer straight off the stream. `http://`, or `https://` with the SSL context it is given (the
gateway passes the one its SDK client uses: the same CAs, `SSL_CERT_FILE`/`SSL_CERT_DIR` included) and
the URL's host name checked against the certificate.

- A connection is reused only after its response was read to the end and did not say `close`,
  and only within `idle_seconds` (2 s) of that: below the keep-alive timeouts servers commonly use
  (5 s and up), so the server does not close it under a new request. A response abandoned half-way
  (a cancelled call) closes its connection, which is what tells a 2026-07-28 upstream that the call
  was cancelled.
- A request is never sent twice: a connection that closes after the request went out, with no
  answer, is a ProtocolError, as a server crashing mid-call would be. The upstream may have run the
  tool; whether to call again is the gateway pipeline's decision (retry policy, status tool).
- Bodies: `Content-Length`, `chunked`, or up to the connection's end; none for 1xx, 204 and 304. A
  body larger than `max_body_bytes` (32 MiB) is a ProtocolError. Interim 1xx answers are skipped.
- At most `max_connections` (100) requests at a time; more wait for a connection.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

__all__ = ["Http1Pool", "Http1Response", "ProtocolError"]

_MAX_HEADER_BYTES = 65_536


class ProtocolError(OSError):
    """The peer answered something that is not HTTP/1.1 (an OSError: the transport is broken)."""


class Http1Response:
    def __init__(self, reader: asyncio.StreamReader, status: int, headers: dict[str, str],
                 max_body_bytes: int = 32 << 20) -> None:
        self.status, self.headers, self._reader = status, headers, reader
        self.complete = False  # the body was read to its end
        self.max_body_bytes = max_body_bytes
        length = headers.get("content-length")
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if status < 200 or status in (204, 304):
            self._chunked, length = False, "0"
        try:
            self._length = int(length) if length is not None and not self._chunked else None
        except ValueError:
            raise ProtocolError(f"Content-Length {length[:40]!r} is not a number") from None

    def _count(self, total: int) -> None:
        if total > self.max_body_bytes:
            raise ProtocolError(f"the answer is larger than {self.max_body_bytes} bytes")

    async def chunks(self) -> AsyncIterator[bytes]:
        reader, total = self._reader, 0
        try:
            if self._chunked:
                while True:
                    line = await reader.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    except ValueError:
                        raise ProtocolError("a chunk's size is not a hexadecimal number") from None
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                            pass
                        break
                    total += size
                    self._count(total)
                    data = await reader.readexactly(size)
                    await reader.readexactly(2)
                    yield data
            elif self._length is not None:
                self._count(self._length)
                if self._length:
                    yield await reader.readexactly(self._length)
            else:
                while data := await reader.read(65_536):
                    total += len(data)
                    self._count(total)
                    yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            raise ProtocolError("the connection broke in the middle of the answer") from None
        self.complete = True

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines, decoded as UTF-8 as they come (a character may straddle two chunks), without their
        line ends (CRLF, LF or CR, a CRLF straddling two chunks included). Linear in the body's size."""
        decoder = codecs.getincrementaldecoder("utf-8")()
        line: list[str] = []  # the pieces of the line not ended yet
        cr = False  # the text so far ended with CR: its LF may come next

        def split(text: str) -> list[str]:
            nonlocal cr
            if cr:
                text, cr = "\r" + text, False
            if text.endswith("\r"):
                text, cr = text[:-1], True
            return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")

        async for chunk in self.chunks():
            try:
                pieces = split(decoder.decode(chunk))
            except UnicodeDecodeError:
                raise ProtocolError("the answer is not UTF-8") from None
            line.append(pieces[0])
            if len(pieces) > 1:
                yield "".join(line)
                for ended in pieces[1:-1]:
                    yield ended
                line = [pieces[-1]]
        try:
            rest = decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ProtocolError("the answer is not UTF-8") from None
        line.append(rest)
        if cr or any(line):
            yield "".join(line)


class Http1Pool:
    """Kept-alive connections to the origin of `url`; `post` sends to its path."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, *, connect_timeout: float = 10.0,
                 max_idle: int = 64, idle_seconds: float = 2.0, max_connections: int = 100,
                 max_body_bytes: int = 32 << 20, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Http1Pool serves http:// and https:// URLs, not {url!r}")
        if parts.scheme == "https" and ssl_context is None:
            raise ValueError(f"{url!r} needs an SSL context")
        self.tls = ssl_context if parts.scheme == "https" else None
        self.host, self.port = parts.hostname, parts.port or (443 if self.tls else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = parts.netloc.rpartition("@")[2]
        self._fixed = f"Host: {authority}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.connect_timeout, self.max_idle, self.idle_seconds = connect_timeout, max_idle, idle_seconds
        # (reader, writer, when it became idle), the most recently used last
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self._slots = asyncio.Semaphore(max_connections)
        self.max_body_bytes = max_body_bytes
        self.closed = False

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if now - since < self.idle_seconds and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        async with asyncio.timeout(self.connect_timeout):
            if self.tls is None:
                return await asyncio.open_connection(self.host, self.port)
            return await asyncio.open_connection(self.host, self.port, ssl=self.tls, server_hostname=self.host)

    async def _send(self, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """Write the request, read the response's head."""
        reader, writer = await self._connection()
        try:
            writer.write(head)
            return reader, writer, await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            writer.close()
            raise ProtocolError("the response's headers are too long") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            raise ProtocolError("the connection closed before a response") from None
        except BaseException:
            writer.close()
            raise

    @contextlib.asynccontextmanager
    async def post(self, body: bytes, headers: dict[str, str]) -> AsyncIterator[Http1Response]:
        head = (f"POST {self.target} HTTP/1.1\r\n{self._fixed}"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                + f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        if self.closed:
            raise ProtocolError("the connection pool is closed")
        async with self._slots:
            reader, writer, raw = await self._send(head)
            reuse = False
            try:
                response = _parse_head(reader, raw, self.max_body_bytes)
                while 100 <= response.status < 200:  # interim answers (100 Continue, 103 Early Hints...)
                    if response.status == 101:
                        raise ProtocolError("the upstream switched protocols")
                    try:
                        raw = await reader.readuntil(b"\r\n\r\n")
                    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                        raise ProtocolError("the connection closed before a final answer") from None
                    response = _parse_head(reader, raw, self.max_body_bytes)
                yield response
                reuse = response.complete and response.headers.get("connection", "").lower() != "close"
            finally:
                if reuse and not self.closed and len(self._idle) < self.max_idle:
                    self._idle.append((reader, writer, time.monotonic()))
                else:
                    writer.close()

    async def aclose(self) -> None:
        self.closed = True  # a request still under way closes its connection when it ends
        idle, self._idle = self._idle, []
        for _, writer, _ in idle:
            writer.close()
        for _, writer, _ in idle:  # closed for good before the caller (or its event loop) goes on
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _parse_head(reader: asyncio.StreamReader, raw: bytes, max_body_bytes: int = 32 << 20) -> Http1Response:
    if len(raw) > _MAX_HEADER_BYTES:
        raise ProtocolError("the response's headers are too long")
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 response: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Http1Response(reader, int(rest[:3]), headers, max_body_bytes)
