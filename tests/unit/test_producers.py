"""Admission of stream entries: producer credentials on command streams, event types per stream,
and the one tenant-id rule on envelopes."""

from __future__ import annotations

import time

import jwt
import pytest

from libs.auth import TokenVerifier, is_tenant_id, issue_token
from libs.config import Settings, load_settings
from libs.errors import DomainError, PermissionDenied, Unauthenticated
from libs.events import Envelope, MalformedEvent
from libs.events.producers import admit, admitted, produce_scope
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from mnemesh.cli import main

SECRET = "producers-unit-test-secret-0123456789abcdef"
PRODUCE = produce_scope(MEMORY_COMMANDS)


@pytest.fixture
def settings() -> Settings:
    return load_settings(jwt_secret=SECRET)


@pytest.fixture
def verifier(settings: Settings) -> TokenVerifier:
    return TokenVerifier(settings)


def command(tenant: str = "acme", credential: str = "") -> Envelope:
    request = memory_pb2.WriteMemoryRequest(tenant=common_pb2.TenantContext(user_id="u1"), content="likes tea")
    return Envelope.wrap(request, event_type="memory.write_requested", tenant_id=tenant, credential=credential)


def token(settings: Settings, tenant: str = "acme", scopes: tuple[str, ...] = (PRODUCE,), ttl: int = 600) -> str:
    return issue_token(settings, subject="crm-sync", tenant_id=tenant, scopes=list(scopes), ttl_seconds=ttl)


async def refused(envelope: Envelope, verifier: TokenVerifier | None, stream: str = MEMORY_COMMANDS) -> DomainError:
    with pytest.raises(DomainError) as err:
        await admit(stream, envelope, verifier)
    assert err.value.retryable is False  # dead-lettered at once, never redelivered
    return err.value


async def test_a_command_with_a_valid_producer_token_is_admitted_as_that_producer(
    settings: Settings, verifier: TokenVerifier
) -> None:
    principal = await admit(MEMORY_COMMANDS, command(credential=token(settings)), verifier)
    assert (principal.subject, principal.tenant_id) == ("crm-sync", "acme")


@pytest.mark.parametrize("scopes", [("produce:*",), ("*",)])
async def test_wildcard_scopes_grant_producing(settings: Settings, verifier: TokenVerifier, scopes) -> None:
    assert await admit(MEMORY_COMMANDS, command(credential=token(settings, scopes=scopes)), verifier)


async def test_a_command_without_a_credential_is_refused_naming_the_auth_field(verifier: TokenVerifier) -> None:
    err = await refused(command(), verifier)
    assert isinstance(err, Unauthenticated)
    assert (err.field, err.reason) == ("auth", "no producer credential")
    assert PRODUCE in err.hint and "mnemesh token --producer" in err.hint


async def test_a_token_signed_with_another_key_is_refused(verifier: TokenVerifier) -> None:
    forged = token(load_settings(jwt_secret="some-other-secret-0123456789abcdefgh"))
    err = await refused(command(credential=forged), verifier)
    assert isinstance(err, Unauthenticated)
    assert (err.field, err.reason) == ("auth", "the token signature does not verify")


async def test_an_expired_token_is_refused(settings: Settings, verifier: TokenVerifier) -> None:
    now = int(time.time())
    expired = jwt.encode({"sub": "crm-sync", "tenant": "acme", "scope": PRODUCE, "iat": now - 7200,
                          "exp": now - 3600, "iss": settings.jwt_issuer, "aud": settings.jwt_audience},
                         SECRET, algorithm="HS256")
    err = await refused(command(credential=expired), verifier)
    assert (err.error_type, err.field, err.reason) == ("unauthenticated", "auth", "the token has expired")


async def test_a_token_that_is_not_a_jwt_is_refused(verifier: TokenVerifier) -> None:
    err = await refused(command(credential="not-a-jwt"), verifier)
    assert err.field == "auth" and err.reason.startswith("the token is not a valid JWT")


@pytest.mark.parametrize("scopes", [("memory:write",), ("produce:mnemesh.tool.events",), ("memory:*",)])
async def test_a_token_without_the_produce_scope_of_this_stream_is_refused(
    settings: Settings, verifier: TokenVerifier, scopes
) -> None:
    err = await refused(command(credential=token(settings, scopes=scopes)), verifier)
    assert isinstance(err, PermissionDenied)
    assert (err.field, err.reason) == ("auth", f"the producer token lacks the scope {PRODUCE!r}")


async def test_a_command_for_another_tenant_than_the_tokens_is_refused(
    settings: Settings, verifier: TokenVerifier
) -> None:
    err = await refused(command(tenant="globex", credential=token(settings, tenant="acme")), verifier)
    assert isinstance(err, PermissionDenied)
    assert err.field == "tenant_id" and "'acme', not 'globex'" in err.reason


async def test_an_event_type_of_another_stream_is_refused_before_any_credential_check(
    settings: Settings, verifier: TokenVerifier
) -> None:
    written = Envelope.wrap(events_pb2.MemoryWritten(), event_type="memory.written", tenant_id="acme",
                            credential=token(settings))
    err = await refused(written, verifier)
    assert isinstance(err, MalformedEvent)
    assert err.field == "event_type"
    assert err.reason == f"memory.written belongs on {MEMORY_EVENTS}, not on {MEMORY_COMMANDS}"
    assert "memory.write_requested" in err.hint


async def test_internal_streams_need_no_producer_credential(verifier: TokenVerifier) -> None:
    written = Envelope.wrap(events_pb2.MemoryWritten(), event_type="memory.written", tenant_id="acme")
    assert await admit(MEMORY_EVENTS, written, verifier) is None


async def test_with_auth_disabled_commands_are_admitted_without_a_credential() -> None:
    assert await admit(MEMORY_COMMANDS, command(), None) is None


async def test_the_wrapped_handler_runs_only_for_admitted_entries(settings: Settings, verifier: TokenVerifier) -> None:
    handled: list[str] = []

    async def handler(envelope: Envelope) -> None:
        handled.append(envelope.event_id)

    handle = admitted(MEMORY_COMMANDS, handler, verifier)
    good = command(credential=token(settings))
    await handle(good)
    with pytest.raises(Unauthenticated):
        await handle(command())
    assert handled == [good.event_id]


def test_the_credential_travels_in_the_auth_field_and_is_never_printed(settings: Settings) -> None:
    secret_token = token(settings)
    envelope = command(credential=secret_token)
    fields = envelope.to_fields()
    assert fields["auth"] == secret_token
    assert Envelope.from_fields(fields).credential == secret_token
    assert secret_token not in repr(envelope)
    assert "auth" not in command().to_fields()  # internal events carry no credential field


@pytest.mark.parametrize("tenant", ["evil tenant/..", "", "a" * 65, "acme\x00", "ténant", "acme\n"])
def test_no_tenant_id_a_token_could_not_hold_is_accepted_in_an_envelope(tenant: str) -> None:
    fields = command().to_fields() | {"tenant_id": tenant}
    assert not is_tenant_id(tenant)
    with pytest.raises(MalformedEvent) as err:
        Envelope.from_fields(fields)
    assert err.value.field == "tenant_id"
    assert len(err.value.reason) < 120  # quotes at most a short prefix of what was sent


@pytest.mark.parametrize("payload", ["[]", "null", '"text"', "{", '{"content": 5}', '{"layer": "NOPE"}'])
def test_a_payload_that_is_not_the_expected_message_is_malformed(payload: str) -> None:
    with pytest.raises(MalformedEvent) as err:
        Envelope.from_fields(command().to_fields() | {"payload": payload})
    assert err.value.field == "payload"
    assert "WriteMemoryRequest" in err.value.reason


def test_the_cli_mints_a_producer_token_for_the_command_stream(monkeypatch, capsys) -> None:
    monkeypatch.setenv("MNEMESH_JWT_SECRET", SECRET)
    assert main(["token", "--producer", "--tenant", "acme", "--subject", "crm-sync"]) == 0
    principal = TokenVerifier(load_settings(jwt_secret=SECRET)).verify(capsys.readouterr().out.strip())
    assert (principal.subject, principal.tenant_id, principal.scopes) == ("crm-sync", "acme", {PRODUCE})


def test_the_cli_refuses_a_producer_token_for_an_internal_stream(capsys) -> None:
    assert main(["token", "--producer", MEMORY_EVENTS, "--tenant", "acme"]) == 2
    assert "use one of mnemesh.memory.commands" in capsys.readouterr().err
