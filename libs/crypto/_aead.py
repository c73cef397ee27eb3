"""AES-256-GCM with a random 96-bit nonce per message: nonce || ciphertext || tag."""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["KEY_BYTES", "CryptoError", "new_key", "open_sealed", "seal"]

KEY_BYTES = 32
_NONCE = 12


class CryptoError(Exception):
    """A ciphertext does not open under this key and context (wrong key, tampered, or shredded)."""


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(blob[:_NONCE], blob[_NONCE:], aad)
    except (InvalidTag, ValueError) as exc:
        raise CryptoError("the ciphertext does not open with this key") from exc
