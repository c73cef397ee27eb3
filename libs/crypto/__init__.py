"""Envelope encryption: AES-256-GCM data keys, wrapped by key-encryption keys, wrapped by a master key.

The master key never leaves its key provider: a local key file in development, a PKCS#11 token
(an HSM; tested with SoftHSM2) in production. Everything below it is an AES-256 key wrapped
(AES-256-GCM, with what the key is for as associated data) by the key above.
"""

from libs.crypto._aead import KEY_BYTES, CryptoError, new_key, open_sealed, seal
from libs.crypto._providers import KeyProvider, LocalKeyFile, Pkcs11Provider, key_provider

__all__ = ["KEY_BYTES", "CryptoError", "KeyProvider", "LocalKeyFile", "Pkcs11Provider", "key_provider", "new_key",
           "open_sealed", "seal"]
