"""JWT authentication: HS256 with a shared secret for development, RS256 for production.

Claims: ``sub`` (who), ``tenant`` (whose data), ``scope`` (space-separated) or
``scopes`` (a list). Errors say exactly what is wrong with the token.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jwt

from libs.config import PUBLISHED_JWT_SECRETS, Settings
from libs.errors import Unauthenticated, Unavailable
from libs.validation import TENANT_ID, TENANT_ID_RULE, is_tenant_id

__all__ = ["TENANT_ID", "TENANT_ID_RULE", "Principal", "TokenVerifier", "current_principal", "is_tenant_id",
           "issue_token", "refuse_published_secret", "service_token"]

# Verified tokens are remembered (token string -> principal) so that an agent calling many times with one
# token does not pay a signature check per call: until the token expires, and at most this long, which
# bounds how long a token keeps working after its signing key was withdrawn from the JWKS.
VERIFIED_TTL_SECONDS = 60.0
VERIFIED_MAX = 4096

@dataclass(frozen=True)
class Principal:
    subject: str
    tenant_id: str
    scopes: frozenset[str]

    def has_scope(self, scope: str) -> bool:
        """`memory:write` is granted by itself, by `memory:*` or by `*`."""
        prefix = scope.split(":", 1)[0]
        return bool({scope, f"{prefix}:*", "*"} & self.scopes)


current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("principal", default=None)


def issue_token(
    settings: Settings, *, subject: str, tenant_id: str, scopes: list[str], ttl_seconds: int = 3600
) -> str:
    """A development token signed with the HS256 secret (`mnemesh token` prints one)."""
    if not is_tenant_id(tenant_id):
        raise ValueError(f"tenant {tenant_id[:64]!r} must be {TENANT_ID_RULE}")
    now = int(time.time())
    claims = {"sub": subject, "tenant": tenant_id, "scope": " ".join(scopes), "iat": now,
              "exp": now + ttl_seconds, "iss": settings.jwt_issuer, "aud": settings.jwt_audience}
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), algorithm="HS256")


def service_token(settings: Settings, configured: str, *, subject: str, scopes: list[str],
                  setting: str) -> Callable[[], str | None]:
    """The credential one service presents to another: `configured` when set, none when auth is off,
    else a short-lived token minted with the HS256 secret at each call (development and tests)."""
    if configured:
        return lambda: configured
    if not settings.auth_enabled:
        return lambda: None
    if settings.jwt_algorithm != "HS256":
        raise ValueError(f"{setting} is needed with RS256: a token with the scopes {' '.join(scopes)}")
    return lambda: issue_token(settings, subject=subject, tenant_id="mesh", scopes=scopes, ttl_seconds=300)


def refuse_published_secret(settings: Settings) -> None:
    """ValueError when tokens would be checked with a secret anyone can read, outside development mode."""
    published = settings.jwt_secret.get_secret_value() in PUBLISHED_JWT_SECRETS
    if published and settings.auth_enabled and settings.jwt_algorithm == "HS256" and not settings.dev_mode:
        raise ValueError("MNEMESH_JWT_SECRET is a secret published in the Mnemesh repository, so anyone could "
                         "sign tokens: set MNEMESH_JWT_SECRET to 32+ random bytes (e.g. `openssl rand -hex 32`), "
                         "or, on a development machine only, set MNEMESH_DEV_MODE=true (`make run` and "
                         "`mnemesh run --dev` do)")


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        self.algorithm = settings.jwt_algorithm
        self.issuer, self.audience = settings.jwt_issuer, settings.jwt_audience
        self.leeway = settings.jwt_leeway_seconds
        self._jwks = jwt.PyJWKClient(settings.jwt_jwks_url) if settings.jwt_jwks_url else None
        if self.algorithm == "HS256":
            self._key: object = settings.jwt_secret.get_secret_value()
            refuse_published_secret(settings)
        elif settings.jwt_public_key_file:
            self._key = Path(settings.jwt_public_key_file).read_text()
        elif self._jwks is None:
            raise ValueError("MNEMESH_JWT_ALGORITHM=RS256 needs MNEMESH_JWT_JWKS_URL or MNEMESH_JWT_PUBLIC_KEY_FILE")
        self._verified: dict[str, tuple[Principal, float]] = {}  # token -> (principal, monotonic deadline)

    @property
    def fetches_keys(self) -> bool:
        """Whether verify() may block on a JWKS fetch (then call it off the event loop)."""
        return self._jwks is not None

    def cached(self, token: str) -> Principal | None:
        """The principal of a token verified less than VERIFIED_TTL_SECONDS ago and not expired yet."""
        hit = self._verified.get(token)
        if hit is None:
            return None
        if time.monotonic() < hit[1]:
            return hit[0]
        self._verified.pop(token, None)
        return None

    def verify(self, token: str | None) -> Principal:
        """The principal of a bearer token; Unauthenticated with the precise reason otherwise.

        A token verified before is answered from memory until its `exp` (at most VERIFIED_TTL_SECONDS);
        only good tokens are remembered. With a JWKS URL this may fetch keys (blocking, cached): call it
        off the event loop (or use cached() first).
        """
        principal = self.cached(token) if token else None
        if principal is not None:
            return principal
        principal, expires = self._verify(token)
        ttl = min(VERIFIED_TTL_SECONDS, expires - time.time())
        if ttl > 0:
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()  # simplest bound; refilled by the next calls
            self._verified[token] = (principal, time.monotonic() + ttl)  # type: ignore[index]
        return principal

    def _verify(self, token: str | None) -> tuple[Principal, float]:
        if not token:
            raise Unauthenticated("no bearer token", field="authorization",
                                  hint="send the metadata 'authorization: Bearer <jwt>' (`mnemesh token` makes one)")
        try:
            key = self._jwks.get_signing_key_from_jwt(token).key if self._jwks else self._key
            claims = jwt.decode(token, key, algorithms=[self.algorithm], issuer=self.issuer, audience=self.audience,
                                leeway=self.leeway, options={"require": ["sub", "exp", "tenant"]})
        except jwt.PyJWKClientConnectionError as exc:
            raise Unavailable(f"the signing keys cannot be fetched: {exc}", field="authorization",
                              hint="retry shortly; operators: check MNEMESH_JWT_JWKS_URL") from None
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired", field="authorization",
                                  hint="get a fresh token and retry") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated(f"the token is not valid yet (nbf or iat more than {self.leeway:g} s ahead of "
                                  "this server's clock)", field="authorization",
                                  hint="check the issuer's clock, or wait until the token's nbf") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the token signature does not verify", field="authorization",
                                  hint="use a token signed by this deployment's issuer key") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"the token lacks the claim {exc.claim!r}", field="authorization",
                                  hint="tokens need sub, exp and tenant claims") from None
        except (jwt.InvalidIssuerError, jwt.InvalidAudienceError) as exc:
            raise Unauthenticated(f"the token is not for this service: {exc}", field="authorization",
                                  hint=f"issue it with iss={self.issuer!r} and aud={self.audience!r}") from None
        except (jwt.PyJWTError, ValueError) as exc:
            raise Unauthenticated(f"the token is not a valid JWT: {exc}", field="authorization",
                                  hint="send a JWT signed with " + self.algorithm) from None
        tenant = claims["tenant"]
        if not is_tenant_id(tenant):
            raise Unauthenticated(f"the token's tenant claim must be {TENANT_ID_RULE}",
                                  field="authorization", hint="issue the token for one named tenant")
        raw = claims.get("scopes", claims.get("scope", ""))
        if isinstance(raw, str):
            raw = raw.split()  # OAuth 2 style: space-separated
        if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
            raise Unauthenticated("the token's scopes must be a space-separated string or a list of strings",
                                  field="authorization", hint="fix the scope claim of the issuer")
        return Principal(subject=str(claims["sub"]), tenant_id=tenant, scopes=frozenset(raw)), float(claims["exp"])
