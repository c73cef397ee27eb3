"""Duplicates: identical memories by normalised content, near-identical ones by MinHash (no I/O).

Shingles are characters, not words, so Chinese (no spaces) and English are treated alike: the
normalised text (see normalize.py) is cut into overlapping 3-character shingles. A MinHash
signature of 64 values estimates the Jaccard similarity of two shingle sets; 16 bands of 4
values are the LSH buckets a store indexes, so candidates are found without comparing against
every memory. Two memories whose estimated similarity reaches NEAR_THRESHOLD are near duplicates.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import struct
import zlib
from collections.abc import Sequence

import numpy as np

from services.memory_writer.domain.normalize import normalized

__all__ = ["BANDS", "NEAR_THRESHOLD", "bands", "content_digest", "lsh_key", "lsh_keys", "minhash", "minhash_many", "similarity"]

PERMUTATIONS = 64
BANDS = 16
ROWS = PERMUTATIONS // BANDS
NEAR_THRESHOLD = 0.6
SHINGLE = 3
_MASK = (1 << 32) - 1
# Multiply-shift hashing, h(x) = ((a*x + b) mod 2^64) >> 32, with fixed odd `a` (derived, not random:
# signatures must be comparable across processes and releases).
_A = np.array([int.from_bytes(hashlib.sha256(f"a{i}".encode()).digest()[:8], "big") | 1
               for i in range(PERMUTATIONS)], dtype=np.uint64)
_B = np.array([int.from_bytes(hashlib.sha256(f"b{i}".encode()).digest()[:8], "big")
               for i in range(PERMUTATIONS)], dtype=np.uint64)


def content_digest(content: str) -> str:
    """What identical memories share: the SHA-256 of the normalised content."""
    return hashlib.sha256(normalized(content).encode()).hexdigest()


def _shingles(content: str) -> set[int]:
    text = normalized(content)
    if len(text) <= SHINGLE:
        grams = {text} if text else set()
    else:
        grams = {text[i:i + SHINGLE] for i in range(len(text) - SHINGLE + 1)}
    return {zlib.crc32(g.encode()) for g in grams}


def minhash(content: str) -> list[int]:
    shingles = _shingles(content)
    if not shingles:
        return [_MASK] * PERMUTATIONS
    x = np.fromiter(shingles, dtype=np.uint64, count=len(shingles))
    hashed = (np.multiply.outer(_A, x) + _B[:, None]) >> np.uint64(32)  # uint64 arithmetic wraps mod 2^64
    return hashed.min(axis=1).tolist()


# Shingles hashed together in one vectorised pass (64 x this many uint64: 8 MiB), so a batch of short
# memories costs a few numpy calls instead of a few per memory, and a long one stays bounded.
_CHUNK = 16_384


def minhash_many(contents: Sequence[str]) -> list[list[int]]:
    """minhash of each content, equal to calling it one by one, computed over the batch at once."""
    signatures: list[list[int]] = [[_MASK] * PERMUTATIONS for _ in contents]
    pending: list[tuple[int, set[int]]] = []
    size = 0

    def run() -> None:
        x = np.fromiter(itertools.chain.from_iterable(s for _, s in pending), dtype=np.uint64, count=size)
        starts = np.cumsum([0] + [len(s) for _, s in pending[:-1]])
        hashed = np.multiply.outer(_A, x)  # in place from here: the array is the batch's largest
        hashed += _B[:, None]
        hashed >>= np.uint64(32)
        for (i, _), row in zip(pending, np.minimum.reduceat(hashed, starts, axis=1).T.tolist(), strict=True):
            signatures[i] = row

    for i, content in enumerate(contents):
        shingles = _shingles(content)
        if not shingles:
            continue
        if pending and size + len(shingles) > _CHUNK:
            run()
            pending, size = [], 0
        pending.append((i, shingles))
        size += len(shingles)
    if pending:
        run()
    return signatures


def bands(signature: list[int]) -> list[str]:
    """The LSH bucket of each band: two signatures sharing any bucket are candidates."""
    return list(_bands(tuple(signature)))


@functools.lru_cache(maxsize=8192)  # a write's buckets are looked up, then stored
def _bands(signature: tuple[int, ...]) -> tuple[str, ...]:
    # Band i is the BLAKE2b of its ROWS values packed big-endian: packed once, then sliced per band.
    width = 4 * ROWS
    packed = struct.pack(f">{len(signature)}I", *signature)
    if len(packed) < width * BANDS:
        raise ValueError(f"a signature of {len(signature)} values has no {BANDS} bands of {ROWS}")
    blake2b = hashlib.blake2b
    return tuple([f"{i}:{blake2b(packed[i * width:(i + 1) * width], digest_size=8).hexdigest()}"
                  for i in range(BANDS)])


@functools.lru_cache(maxsize=16_384)  # a batch looks its buckets up by key, then stores the same keys
def lsh_key(user_id: str, layer: int, bucket: str) -> int:
    """A bucket of one user's layer as one signed 64-bit key (the store indexes these; the migration
    that introduced them computes the same in SQL)."""
    return int.from_bytes(hashlib.sha256(f"{user_id}|{layer}|{bucket}".encode()).digest()[:8], "big", signed=True)


def lsh_keys(user_id: str, layer: int, signature: list[int]) -> list[int]:
    return list(_lsh_keys(user_id, layer, tuple(signature)))


@functools.lru_cache(maxsize=4096)  # a batch needs a write's keys to look up, then to store
def _lsh_keys(user_id: str, layer: int, signature: tuple[int, ...]) -> tuple[int, ...]:
    # lsh_key of each band, the common prefix hashed once (a SHA-256 state copied per band).
    prefix = hashlib.sha256(f"{user_id}|{layer}|".encode())
    keys = []
    for bucket in _bands(signature):
        digest = prefix.copy()
        digest.update(bucket.encode())
        keys.append(int.from_bytes(digest.digest()[:8], "big", signed=True))
    return tuple(keys)


def similarity(a: list[int], b: list[int]) -> float:
    """The estimated Jaccard similarity of the shingle sets behind two signatures."""
    if len(a) != len(b):
        raise ValueError(f"signatures of {len(a)} and {len(b)} values cannot be compared")
    return sum(map(operator.eq, a, b)) / PERMUTATIONS
