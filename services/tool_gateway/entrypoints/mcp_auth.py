"""Bearer-token authentication for the MCP endpoint (HTTP), with the tokens gRPC accepts.

A request without a valid token is answered 401, one whose token lacks the endpoint's scope
403 (with `WWW-Authenticate: Bearer error="insufficient_scope"`, as the MCP authorization spec
asks). The body is a JSON-RPC error whose `data` is the structured error
`{error_type, field, reason, retryable, hint}`, so an MCP client relays the precise reason
instead of a bare status. An accepted request carries its caller in the ASGI scope (`user`),
where the SDK also looks when it binds sessions to a credential.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from libs.auth import Principal, TokenVerifier
from libs.errors import DomainError, PermissionDenied, Unauthenticated
from libs.logs import get_logger

__all__ = ["BearerAuth", "Caller"]

log = get_logger(__name__)
_ANONYMOUS = Principal(subject="anonymous", tenant_id="", scopes=frozenset({"*"}))
_MAX_CALLERS = 4_096  # tokens whose Caller is kept
_STATUS = {"unauthenticated": 401, "permission_denied": 403, "unavailable": 503}


class Caller(AuthenticatedUser):
    """The authenticated caller of one HTTP request, as the SDK expects it, plus our Principal."""

    def __init__(self, principal: Principal, token: str) -> None:
        super().__init__(AccessToken(token=token, client_id=principal.subject,
                                     scopes=sorted(principal.scopes), subject=principal.subject,
                                     claims={"tenant": principal.tenant_id}))
        self.principal = principal


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', "'") + '"'


def refusal(error: DomainError, required_scope: str, *, token_sent: bool, resource_metadata: str = "") -> Response:
    """The HTTP answer to a request refused before it reaches MCP.

    `resource_metadata`: the URL of the protected-resource metadata (RFC 9728), named in the challenge
    so an MCP client can find out where to get a token (the MCP authorization spec).
    """
    status = _STATUS.get(error.error_type, 500)
    body = {"jsonrpc": "2.0", "id": None,
            "error": {"code": INVALID_REQUEST if status < 500 else INTERNAL_ERROR,
                      "message": f"{error.error_type}: {error.reason}", "data": error.to_dict()}}
    headers = {}
    metadata = f"resource_metadata={_quoted(resource_metadata)}" if resource_metadata else ""
    if status == 401:
        # RFC 6750 section 3.1: no error code when the request carried no credentials at all.
        params = [metadata] if not token_sent else \
            ['error="invalid_token"', f"error_description={_quoted(error.reason)}", metadata]
        headers["WWW-Authenticate"] = ("Bearer " + ", ".join(p for p in params if p)).rstrip()
    elif status == 403:
        params = ['error="insufficient_scope"', f"scope={_quoted(required_scope)}",
                  f"error_description={_quoted(error.reason)}", metadata]
        headers["WWW-Authenticate"] = "Bearer " + ", ".join(p for p in params if p)
    return Response(json.dumps(body, ensure_ascii=False), status_code=status, headers=headers,
                    media_type="application/json")


class BearerAuth:
    """ASGI middleware: authenticate every HTTP request, require `required_scope`, log the outcome.

    `verifier` None (auth disabled) lets every request in as an anonymous caller with every scope.
    """

    def __init__(self, app: ASGIApp, verifier: TokenVerifier | None, *, required_scope: str,
                 resource_metadata: Callable[[Scope], str] | None = None) -> None:
        self.app, self.verifier, self.required_scope = app, verifier, required_scope
        self.resource_metadata = resource_metadata
        self._callers: dict[str, tuple[Principal, Caller, AuthCredentials]] = {}

    def _caller(self, principal: Principal, token: str) -> tuple[Caller, AuthCredentials]:
        """The request's user and credentials, built once per verified token: kept only while the verifier
        answers with the same principal (its memory of the token, bounded by the token's `exp`)."""
        held = self._callers.get(token)
        if held is not None and held[0] is principal:
            return held[1], held[2]
        if len(self._callers) >= _MAX_CALLERS:
            self._callers.clear()  # simplest bound; refilled by the next requests
        caller, credentials = Caller(principal, token), AuthCredentials(sorted(principal.scopes))
        self._callers[token] = (principal, caller, credentials)
        return caller, credentials

    async def _authenticate(self, token: str) -> Principal:
        if self.verifier is None:
            return _ANONYMOUS
        if not token:
            raise Unauthenticated("no bearer token", field="authorization",
                                  hint="send the header 'Authorization: Bearer <jwt>' "
                                       "(`mnemesh token` makes one)")
        if self.verifier.algorithm == "HS256":
            return self.verifier.verify(token)
        cached = self.verifier.cached(token)  # no thread hop for a token verified before
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.verifier.verify, token)  # may fetch JWKS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events pass through
            await self.app(scope, receive, send)
            return
        started, status, subject = time.perf_counter(), 0, ""
        header = Headers(scope=scope).get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""

        async def send_recording_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            try:
                principal = await self._authenticate(token)
                subject = principal.subject
                if not principal.has_scope(self.required_scope):
                    raise PermissionDenied(f"the token lacks the scope {self.required_scope!r}",
                                           field="authorization",
                                           hint=f"ask for a token with scope {self.required_scope} "
                                                "(and tools:call to call tools)")
            except DomainError as exc:
                metadata = self.resource_metadata(scope) if self.resource_metadata else ""
                await refusal(exc, self.required_scope, token_sent=bool(token), resource_metadata=metadata)(
                    scope, receive, send_recording_status)
                return
            scope["user"], scope["auth"] = self._caller(principal, token)
            await self.app(scope, receive, send_recording_status)
        finally:
            log.info("mcp http", method=scope["method"], path=scope["path"], status=status, subject=subject,
                     duration_ms=round((time.perf_counter() - started) * 1000, 2))
