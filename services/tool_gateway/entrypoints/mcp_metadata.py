"""OAuth 2.0 Protected Resource Metadata (RFC 9728) for the MCP endpoint, as the MCP authorization
spec asks of a server that needs a token.

`GET /.well-known/oauth-protected-resource/mcp` (the path-inserted form RFC 9728 section 3.1 gives for
the resource `<origin>/mcp`) and `GET /.well-known/oauth-protected-resource` (the root form clients fall
back to) answer, without a token:

    {"resource": "http://127.0.0.1:8765/mcp", "authorization_servers": ["https://idp.example"],
     "scopes_supported": ["tools:read", "tools:call"], "bearer_methods_supported": ["header"], ...}

and every 401/403 of the endpoint names that document in `WWW-Authenticate: Bearer
resource_metadata="..."`, so a client that has no token learns where to get one. The resource URL
is MNEMESH_MCP_RESOURCE_URL when set (the address clients use, behind a proxy), else the request's
own scheme and Host; the authorization servers are MNEMESH_MCP_AUTHORIZATION_SERVERS.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["WELL_KNOWN", "ProtectedResourceMetadata"]

WELL_KNOWN = "/.well-known/oauth-protected-resource"


class ProtectedResourceMetadata:
    def __init__(self, path: str, *, resource_url: str = "", authorization_servers: tuple[str, ...] = (),
                 scopes: tuple[str, ...] = ()) -> None:
        self.path, self.resource_url = path, resource_url.rstrip("/")
        self.authorization_servers, self.scopes = authorization_servers, scopes

    def _origin(self, scope: Scope) -> str:
        if self.resource_url:
            return self.resource_url[: len(self.resource_url) - len(self.path)] \
                if self.resource_url.endswith(self.path) else self.resource_url
        host = Headers(scope=scope).get("host") or "{}:{}".format(*(scope.get("server") or ("127.0.0.1", 80)))
        return f"{scope.get('scheme', 'http')}://{host}"

    def resource(self, scope: Scope) -> str:
        return self.resource_url or f"{self._origin(scope)}{self.path}"

    def url_for(self, scope: Scope) -> str:
        """Where the metadata of the resource this request addressed is."""
        if self.resource_url and not self.resource_url.endswith(self.path):
            return f"{self.resource_url}{WELL_KNOWN}"
        return f"{self._origin(scope)}{WELL_KNOWN}{self.path}"

    def document(self, scope: Scope) -> dict[str, object]:
        doc: dict[str, object] = {"resource": self.resource(scope), "scopes_supported": list(self.scopes),
                                  "bearer_methods_supported": ["header"],
                                  "resource_name": "Mnemesh tool-gateway (MCP)"}
        if self.authorization_servers:
            doc["authorization_servers"] = list(self.authorization_servers)
        return doc

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """`app` behind the two well-known paths, which need no token (they say how to get one)."""
        paths = {WELL_KNOWN, f"{WELL_KNOWN}{self.path}"}

        async def metadata_first(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["path"] in paths:
                if scope["method"] not in ("GET", "HEAD"):
                    await Response("GET only", status_code=405, headers={"Allow": "GET"})(scope, receive, send)
                    return
                await Response(json.dumps(self.document(scope)), media_type="application/json",
                               headers={"Cache-Control": "max-age=3600"})(scope, receive, send)
                return
            await app(scope, receive, send)

        return metadata_first
