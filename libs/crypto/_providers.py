"""Key providers: where the master key lives. `wrap`/`unwrap` protect the keys below it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import Protocol

from libs.crypto._aead import KEY_BYTES, CryptoError, new_key, open_sealed, seal

__all__ = ["KeyProvider", "LocalKeyFile", "Pkcs11Provider", "key_provider"]


class KeyProvider(Protocol):
    key_id: str  # names the master key (recorded beside what it wrapped, so rotation knows what to redo)

    def wrap(self, key: bytes, context: bytes) -> bytes: ...
    def unwrap(self, wrapped: bytes, context: bytes) -> bytes: ...


class LocalKeyFile:
    """A 256-bit master key in a file (development): created with mode 0600 when `create` and missing."""

    def __init__(self, path: str | Path, *, create: bool = False) -> None:
        path = Path(path)
        if not path.exists():
            if not create:
                raise FileNotFoundError(f"no master key file at {path}: create one (32 random bytes, mode 0600) "
                                        "or configure a PKCS#11 provider")
            path.parent.mkdir(parents=True, exist_ok=True)
            _create_once(path, new_key())
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            raise ValueError(f"the master key file {path} must hold exactly {KEY_BYTES} bytes, not {len(key)}")
        self._key = key
        self.key_id = "file:" + hashlib.sha256(b"mnemesh-key-id" + key).hexdigest()[:16]

    def wrap(self, key: bytes, context: bytes) -> bytes:
        return seal(self._key, key, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        return open_sealed(self._key, wrapped, context)


def _create_once(path: Path, data: bytes) -> None:
    """`path` holding `data` (mode 0600) unless it exists, atomically: a process starting beside this one
    sees no file or the whole key, never a half-written one, and of two creators one wins, the other
    reading its key. (The key is written to a file of its own, then hard-linked into place.)"""
    spare = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process created it first: its key it is
            os.link(spare, path)
    finally:
        spare.unlink(missing_ok=True)


# A PKCS#11 application logs in to a token once: every provider on the same token shares that
# logged-in session (the token's state is per process, so this table mirrors it rather than adding any).
_SESSIONS: dict[tuple[str, str], tuple[object, threading.Lock, list[int]]] = {}
_SESSIONS_LOCK = threading.Lock()


class Pkcs11Provider:
    """The master key is an AES key inside a PKCS#11 token; wrapping runs in the token (CKM_AES_GCM).

    The logged-in session of the token is shared by its providers; calls are serialised (a PKCS#11
    session is not thread-safe).
    """

    def __init__(self, library: str, token_label: str, pin: str, key_label: str, *, create: bool = False) -> None:
        import pkcs11  # imported here: only deployments with an HSM load a PKCS#11 library
        from pkcs11 import Attribute, KeyType, ObjectClass
        from pkcs11.exceptions import NoSuchKey

        self._pkcs11 = pkcs11
        self._where = (library, token_label)
        with _SESSIONS_LOCK:
            if self._where not in _SESSIONS:
                token = pkcs11.lib(library).get_token(token_label=token_label)
                _SESSIONS[self._where] = (token.open(user_pin=pin, rw=True), threading.Lock(), [0])
            self._session, self._lock, users = _SESSIONS[self._where]
            users[0] += 1
        try:
            self._key = self._session.get_key(object_class=ObjectClass.SECRET_KEY, key_type=KeyType.AES,
                                              label=key_label)
        except NoSuchKey:
            if not create:
                self.close()
                raise
            self._key = self._session.generate_key(KeyType.AES, 256, label=key_label, store=True, template={
                Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        self.key_id = f"pkcs11:{token_label}/{key_label}"

    def wrap(self, key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(12)
        with self._lock:
            sealed = self._key.encrypt(key, mechanism=self._pkcs11.Mechanism.AES_GCM,
                                       mechanism_param=self._pkcs11.GCMParams(nonce, context))
        return nonce + bytes(sealed)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        try:
            with self._lock:
                return bytes(self._key.decrypt(wrapped[12:], mechanism=self._pkcs11.Mechanism.AES_GCM,
                                               mechanism_param=self._pkcs11.GCMParams(wrapped[:12], context)))
        except self._pkcs11.exceptions.PKCS11Error as exc:
            raise CryptoError("the token could not unwrap this key") from exc

    def close(self) -> None:
        with _SESSIONS_LOCK:
            session, _, users = _SESSIONS[self._where]
            users[0] -= 1
            if users[0] == 0:
                del _SESSIONS[self._where]
                session.close()


def key_provider(spec: str, data_dir: Path, *, pin: str = "", dev_mode: bool = False) -> KeyProvider:
    """The provider a settings string names: `file:<path>` (`file:` alone: <data_dir>/master.key, created
    when missing) or `pkcs11:<library>|<token label>|<key label>` (the PIN from the settings)."""
    kind, _, rest = spec.partition(":")
    if kind == "file":
        return LocalKeyFile(rest or data_dir / "master.key", create=dev_mode or not rest)
    if kind == "pkcs11":
        library, token, label = (rest.split("|") + ["", "", ""])[:3]
        if not (library and token and label and pin):
            raise ValueError("a PKCS#11 key provider needs MNEMESH_MASTER_KEY=pkcs11:<library>|<token label>|"
                             "<key label> and MNEMESH_PKCS11_PIN")
        return Pkcs11Provider(library, token, pin, label)
    raise ValueError(f"unknown key provider {kind!r}: use file:<path> or pkcs11:<library>|<token>|<key label>")
