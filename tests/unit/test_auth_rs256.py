"""RS256 tokens: verified with a PEM public key file, or with keys from a JWKS endpoint."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from libs.auth import TokenVerifier
from libs.config import load_settings
from libs.errors import Unauthenticated


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def token(key: rsa.RSAPrivateKey, kid: str = "k1", **claims) -> str:
    body = {"sub": "svc", "tenant": "acme", "scope": "memory:read", "exp": int(time.time()) + 60,
            "iss": "mnemesh", "aud": "mnemesh", **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def jwks_url(key: rsa.RSAPrivateKey) -> Iterator[str]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/.well-known/jwks.json"
    server.shutdown()
    server.server_close()
    thread.join()


def test_an_rs256_token_verifies_against_the_public_key_file(key: rsa.RSAPrivateKey, tmp_path: Path) -> None:
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    verifier = TokenVerifier(load_settings(jwt_algorithm="RS256", jwt_public_key_file=pem))
    assert verifier.verify(token(key)).scopes == frozenset({"memory:read"})


def test_an_rs256_token_verifies_against_keys_from_a_jwks_endpoint(key: rsa.RSAPrivateKey, jwks_url: str) -> None:
    verifier = TokenVerifier(load_settings(jwt_algorithm="RS256", jwt_jwks_url=jwks_url))
    assert verifier.verify(token(key)).tenant_id == "acme"


def test_a_token_signed_by_another_key_fails_against_the_jwks(jwks_url: str) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verifier = TokenVerifier(load_settings(jwt_algorithm="RS256", jwt_jwks_url=jwks_url))
    with pytest.raises(Unauthenticated) as caught:
        verifier.verify(token(stranger))
    assert "signature" in caught.value.reason


def test_rs256_without_a_key_source_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="MNEMESH_JWT_JWKS_URL or MNEMESH_JWT_PUBLIC_KEY_FILE"):
        TokenVerifier(load_settings(jwt_algorithm="RS256"))


def test_an_unreachable_jwks_endpoint_is_unavailable_not_a_bad_token(key: rsa.RSAPrivateKey) -> None:
    from libs.errors import Unavailable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    verifier = TokenVerifier(load_settings(jwt_algorithm="RS256", jwt_jwks_url=f"http://127.0.0.1:{closed}/jwks"))
    with pytest.raises(Unavailable) as caught:
        verifier.verify(token(key))
    assert caught.value.retryable and "MNEMESH_JWT_JWKS_URL" in caught.value.hint
