"""Plain HTTP/JSON backends: `http:<METHOD> <url template>`, e.g. `http:GET https://crm/customers/{id}`.

Placeholders take their argument, URL-encoded; a form-style query expansion `{?a,b}` (RFC 6570) puts
those of its names that the call has in the query string; the other arguments go in the query string
(GET, DELETE) or as the JSON body (POST, PUT, PATCH). A JSON object answer is the result, any other
JSON value comes back as `{"result": value}`. Failures are mapped, never passed on raw: 408, 429
and 5xx and transport errors are retryable `unavailable`, other 4xx `backend_error` (not retried).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import httpx

from libs.errors import Unavailable, ValidationFailed
from services.tool_gateway.domain import BackendFailed

__all__ = ["HttpBackend", "parse_target"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_QUERY_EXPANSION = re.compile(r"\{\?([^}]*)\}")
_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
_BODY = {"POST", "PUT", "PATCH"}


def parse_target(target: str) -> tuple[str, str]:
    method, _, url = target.partition(" ")
    if url and method.upper() in _METHODS:
        return method.upper(), url.strip()
    return "POST", target.strip()


def _message(response: httpx.Response) -> str:
    """A short, safe reason from an error answer: its JSON message when there is one."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if isinstance(body, dict):
        for key in ("message", "error_description", "detail", "error"):
            if isinstance(body.get(key), str):
                return body[key][:200]
    return ""


class HttpBackend:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def call(self, target: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        method, template = parse_target(target)
        rest = dict(arguments)
        missing = [name for name in _PLACEHOLDER.findall(template) if name not in rest]
        if missing:
            raise ValidationFailed("is required by the backend URL", field=f"arguments/{missing[0]}",
                                   hint="add it to the tool's input schema as required")
        query: dict[str, Any] = {}
        for expansion in _QUERY_EXPANSION.findall(template):
            for name in (n.strip() for n in expansion.split(",")):
                if name in rest:
                    query[name] = rest.pop(name)
        template = _QUERY_EXPANSION.sub("", template)
        url = _PLACEHOLDER.sub(lambda m: quote(str(rest.pop(m.group(1))), safe=""), template)
        if method not in _BODY:
            query.update(rest)
        params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in query.items()} or None
        try:
            response = await self.client.request(method, url, params=params,
                                                 json=rest if method in _BODY else None, timeout=timeout)
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.TransportError as exc:
            raise Unavailable(f"the backend is unreachable ({type(exc).__name__})",
                              hint="retry with backoff; operators: check the backend") from None
        status = response.status_code
        reason = _message(response)
        if status in (408, 429) or status >= 500:
            raise Unavailable(f"the backend answered HTTP {status}" + (f": {reason}" if reason else ""),
                              hint="retry with backoff")
        if status >= 400:
            raise BackendFailed(f"the backend refused the call (HTTP {status})" + (f": {reason}" if reason else ""),
                                field="arguments", hint="check the arguments against the tool's description")
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError:
            raise BackendFailed("the backend answered something that is not JSON", retryable=False,
                                hint="operators: point the tool at a JSON endpoint") from None
        return body if isinstance(body, dict) else {"result": body}
