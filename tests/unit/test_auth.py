"""JWT verification: a good token gives a principal; every bad one is refused saying why."""

from __future__ import annotations

import time

import jwt
import pytest

from libs.auth import Principal, TokenVerifier, issue_token
from libs.config import Settings, load_settings
from libs.errors import Unauthenticated

SECRET = "unit-test-secret-long-enough-for-hs512-which-wants-64-bytes-0123456789"


@pytest.fixture
def settings() -> Settings:
    return load_settings(jwt_secret=SECRET)


def refused(settings: Settings, token: str | None) -> Unauthenticated:
    with pytest.raises(Unauthenticated) as err:
        TokenVerifier(settings).verify(token)
    assert err.value.field == "authorization"
    return err.value


def claims(settings: Settings, **changes) -> dict:
    now = int(time.time())
    base = {"sub": "agent-7", "tenant": "acme", "scope": "memory:read", "iat": now, "exp": now + 600,
            "iss": settings.jwt_issuer, "aud": settings.jwt_audience}
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


def test_a_valid_token_gives_the_principal_with_its_scopes(settings: Settings) -> None:
    token = issue_token(settings, subject="agent-7", tenant_id="acme", scopes=["memory:read", "tools:call"])
    principal = TokenVerifier(settings).verify(token)
    assert principal == Principal("agent-7", "acme", frozenset({"memory:read", "tools:call"}))


def test_scopes_may_also_be_given_as_a_list_claim(settings: Settings) -> None:
    token = jwt.encode(claims(settings, scope=None, scopes=["memory:write"]), SECRET, algorithm="HS256")
    assert TokenVerifier(settings).verify(token).scopes == frozenset({"memory:write"})


def test_a_scopes_claim_given_as_a_string_never_grants_scopes_it_does_not_name(settings: Settings) -> None:
    token = jwt.encode(claims(settings, scope=None, scopes="memory:*"), SECRET, algorithm="HS256")
    try:
        principal = TokenVerifier(settings).verify(token)
    except Unauthenticated:
        return  # refusing the malformed claim is as good as reading it right
    assert not principal.has_scope("tools:call")
    assert principal.scopes == frozenset({"memory:*"})


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_is_refused_saying_how_to_send_one(settings: Settings, token: str | None) -> None:
    error = refused(settings, token)
    assert "no bearer token" in error.reason
    assert "Bearer" in error.hint


def test_an_expired_token_is_refused(settings: Settings) -> None:
    token = issue_token(settings, subject="agent-7", tenant_id="acme", scopes=[], ttl_seconds=-60)
    assert "expired" in refused(settings, token).reason


def test_a_token_signed_with_another_secret_is_refused(settings: Settings) -> None:
    other = load_settings(jwt_secret="another-secret-that-is-also-long-enough-for-hs256")
    token = issue_token(other, subject="agent-7", tenant_id="acme", scopes=[])
    assert "signature" in refused(settings, token).reason


def test_a_token_without_a_tenant_is_refused_naming_the_claim(settings: Settings) -> None:
    token = jwt.encode(claims(settings, tenant=None), SECRET, algorithm="HS256")
    assert "'tenant'" in refused(settings, token).reason


def test_a_token_for_another_audience_is_refused(settings: Settings) -> None:
    token = jwt.encode(claims(settings, aud="someone-else"), SECRET, algorithm="HS256")
    error = refused(settings, token)
    assert "not for this service" in error.reason
    assert "aud='mnemesh'" in error.hint


def test_a_token_from_another_issuer_is_refused(settings: Settings) -> None:
    token = jwt.encode(claims(settings, iss="evil"), SECRET, algorithm="HS256")
    assert "not for this service" in refused(settings, token).reason


@pytest.mark.parametrize("token", ["garbage", "a.b.c", "Bearer xyz"])
def test_a_token_that_is_not_a_jwt_is_refused(settings: Settings, token: str) -> None:
    assert "not a valid JWT" in refused(settings, token).reason


def test_a_token_using_another_algorithm_is_refused(settings: Settings) -> None:
    token = jwt.encode(claims(settings), SECRET, algorithm="HS512")
    assert "not a valid JWT" in refused(settings, token).reason


def test_rs256_without_a_key_source_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="MNEMESH_JWT_JWKS_URL"):
        TokenVerifier(load_settings(jwt_algorithm="RS256"))


@pytest.mark.parametrize(("granted", "asked", "allowed"), [
    ({"memory:write"}, "memory:write", True),
    ({"memory:read"}, "memory:write", False),
    ({"memory:*"}, "memory:write", True),
    ({"memory:*"}, "memory:forget", True),
    ({"memory:*"}, "tools:call", False),
    ({"*"}, "tools:call", True),
    ({"*"}, "memory:write", True),
    (set(), "memory:read", False),
    ({"memory"}, "memory:read", False),
])
def test_a_scope_is_granted_by_itself_by_its_service_wildcard_or_by_star(granted: set[str], asked: str,
                                                                          allowed: bool) -> None:
    assert Principal("agent-7", "acme", frozenset(granted)).has_scope(asked) is allowed


# --- safer defaults ------------------------------------------------------------------------------------------


def test_the_published_default_secret_is_refused_outside_development_mode() -> None:
    with pytest.raises(ValueError, match="MNEMESH_DEV_MODE"):
        TokenVerifier(load_settings())
    with pytest.raises(ValueError, match="published"):
        TokenVerifier(load_settings(jwt_secret="change-me-placeholder-dev-only-0123456789abcdef"))
    assert TokenVerifier(load_settings(dev_mode=True)).algorithm == "HS256"


def test_clock_skew_within_the_leeway_is_tolerated_and_beyond_it_refused(settings: Settings) -> None:
    now = int(time.time())
    verifier = TokenVerifier(settings)  # 30 s by default
    for skewed in ({"exp": now - 10}, {"nbf": now + 10}, {"iat": now + 10}):
        verifier.verify(jwt.encode(claims(settings, **skewed), SECRET, algorithm="HS256"))
    assert "expired" in refused(settings, jwt.encode(claims(settings, exp=now - 60), SECRET, algorithm="HS256")).reason
    for future in ({"nbf": now + 60}, {"iat": now + 60}):
        assert "not valid yet" in refused(settings, jwt.encode(claims(settings, **future), SECRET,
                                                               algorithm="HS256")).reason
    strict = load_settings(jwt_secret=SECRET, jwt_leeway_seconds=0)
    assert "expired" in refused(strict, jwt.encode(claims(strict, exp=now - 10), SECRET, algorithm="HS256")).reason


def test_a_verified_token_is_answered_from_memory_until_it_expires(settings: Settings, monkeypatch) -> None:
    verifier = TokenVerifier(settings)
    token = issue_token(settings, subject="agent-7", tenant_id="acme", scopes=["tools:call"], ttl_seconds=600)
    first = verifier.verify(token)
    decoded = []

    def refuse(*args, **kwargs):
        decoded.append(1)
        raise jwt.InvalidSignatureError("stub")

    monkeypatch.setattr(jwt, "decode", refuse)
    assert verifier.verify(token) == first and verifier.cached(token) == first
    assert decoded == []  # no second signature check
    # Past the remembered deadline the token is checked again (here: refused by the stubbed decode).
    monkeypatch.setattr(time, "monotonic", lambda: 10**12)
    assert verifier.cached(token) is None
    with pytest.raises(Unauthenticated):
        verifier.verify(token)
    assert decoded == [1]


def test_a_refused_or_already_expired_token_is_never_remembered(settings: Settings) -> None:
    verifier = TokenVerifier(settings)
    expired = jwt.encode(claims(settings, exp=int(time.time()) - 1000), SECRET, algorithm="HS256")
    with pytest.raises(Unauthenticated):
        verifier.verify(expired)
    assert verifier.cached(expired) is None
    # Within the leeway the token still verifies, but it is past its exp: not remembered.
    late = jwt.encode(claims(settings, exp=int(time.time()) - 1), SECRET, algorithm="HS256")
    verifier.verify(late)
    assert verifier.cached(late) is None
