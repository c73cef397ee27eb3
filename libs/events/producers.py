"""Admission of stream entries: who may put what on a stream, checked before any handler runs.

Every entry must carry an event type that belongs to the stream it was read from (a
``memory.written`` on the command stream would otherwise reach the command handler).
Entries of an *external* stream (written by producers outside the mesh, see
``Stream.external``) must also carry a producer credential in the stream field
``auth``: a JWT from the same issuer and keys as gRPC tokens, with the scope
``produce:<stream>`` (or ``produce:*`` / ``*``), for the tenant the envelope names.

A refused entry raises a non-retryable DomainError, which the bus dead-letters at once
with the structured reason; nothing is written. Internal streams carry no credential:
only the owning service's Redis user may XADD to them (infra/redis/users.acl), so an
entry on them came from the mesh itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from libs.auth import Principal, TokenVerifier
from libs.errors import PermissionDenied, Unauthenticated
from libs.events.envelope import CREDENTIAL_FIELD, Envelope, MalformedEvent
from libs.events.schema import EVENT_TYPES, STREAMS
from libs.validation import check_message

__all__ = ["admit", "admitted", "produce_scope"]

Handler = Callable[[Envelope], Awaitable[None]]

_TOKEN_HINT = ("publish with the stream field 'auth' holding a producer JWT with the scope "
               "'{scope}' (`mnemesh token --producer --tenant <tenant>` makes one in development)")


def produce_scope(stream: str) -> str:
    """The scope a producer token needs to publish on `stream` (its logical name, without namespace)."""
    return f"produce:{stream}"


async def admit(stream: str, envelope: Envelope, verifier: TokenVerifier | None) -> Principal | None:
    """Check that `envelope` may be handled from `stream`; return the producer, when one was verified.

    Raises MalformedEvent, Unauthenticated or PermissionDenied (all non-retryable) with
    the field at fault and what to do.
    """
    if envelope.stream != stream:
        allowed = sorted(name for name, spec in EVENT_TYPES.items() if spec.stream == stream)
        raise MalformedEvent(field="event_type", reason=f"{envelope.event_type} belongs on {envelope.stream}, "
                                                        f"not on {stream}",
                             hint=f"publish one of {', '.join(allowed)} here" if allowed else
                             "publish nothing on this stream")
    spec = STREAMS.get(stream)
    if spec is None or not spec.external:
        return None  # an internal stream, written only by the mesh
    principal = None if verifier is None else await _verified(stream, envelope, verifier)
    # The same input rules as the gRPC edge (libs/validation): a NUL byte or an oversized field is refused
    # here, naming the field, instead of failing deep in a handler.
    check_message(envelope.message())
    return principal


async def _verified(stream: str, envelope: Envelope, verifier: TokenVerifier) -> Principal:
    scope = produce_scope(stream)
    if not envelope.credential:
        raise Unauthenticated("no producer credential", field=CREDENTIAL_FIELD, hint=_TOKEN_HINT.format(scope=scope))
    try:
        if verifier.fetches_keys:
            principal = await asyncio.to_thread(verifier.verify, envelope.credential)
        else:
            principal = verifier.verify(envelope.credential)
    except Unauthenticated as exc:
        # Same reason as on gRPC, but naming the stream field rather than the gRPC metadata.
        raise Unauthenticated(exc.reason, field=CREDENTIAL_FIELD, hint=exc.hint) from None
    if not principal.has_scope(scope):
        raise PermissionDenied(f"the producer token lacks the scope {scope!r}", field=CREDENTIAL_FIELD,
                               hint=_TOKEN_HINT.format(scope=scope))
    if principal.tenant_id != envelope.tenant_id:
        raise PermissionDenied(f"the producer token is for tenant {principal.tenant_id!r}, not "
                               f"{envelope.tenant_id!r}", field="tenant_id",
                               hint="publish under the token's tenant, or get a token for this tenant")
    return principal


def admitted(stream: str, handler: Handler, verifier: TokenVerifier | None) -> Handler:
    """Wrap `handler` so only entries that pass `admit` reach it; the check runs outside its transaction."""

    async def handle(envelope: Envelope) -> None:
        await admit(stream, envelope, verifier)
        await handler(envelope)

    return handle
