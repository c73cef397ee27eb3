"""Deduplication: identical memories merged (no second row), near duplicates linked, not dropped."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from fakes import FakeUnitOfWork, MemoryDatabase
from hypothesis import given
from hypothesis import strategies as st

from libs.errors import IdempotencyKeyReused
from services.memory_writer.domain import Layer, MemoryMerged, Source, WriteMemory, WriteStatus
from services.memory_writer.domain import similarity as similarity_module
from services.memory_writer.domain.similarity import (
    NEAR_THRESHOLD,
    bands,
    content_digest,
    lsh_key,
    lsh_keys,
    minhash,
    minhash_many,
    similarity,
)
from services.memory_writer.service_layer.handlers import write_memory

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def a_write(content: str, **changes) -> WriteMemory:
    return replace(WriteMemory(tenant_id="acme", user_id="u1", session_id="s1", layer=Layer.LONG_TERM,
                               source=Source.USER_STATEMENT, content=content), **changes)


async def test_an_identical_memory_is_merged_into_the_first_with_its_provenance_and_no_second_row() -> None:
    db = MemoryDatabase()
    first = await write_memory(a_write("I prefer window seats.", tags=("travel",)), FakeUnitOfWork(db), now=NOW)
    again = await write_memory(a_write("i  PREFER window seats", tags=("seats",), derived_from=("msg-9",),
                                       source=Source.AUTHORITATIVE_API), FakeUnitOfWork(db), now=NOW)
    assert again.status is WriteStatus.MERGED and again.memory_id == first.memory_id
    kept = db.rows[first.memory_id]
    assert len(db.rows) == 1 and kept.merged_count == 1 and kept.engagement == 1.0
    assert kept.tags == ("travel", "seats") and kept.derived_from == ("msg-9",)
    merged = [e for _, e in db.published if isinstance(e, MemoryMerged)]
    assert merged and merged[0].write.source is Source.AUTHORITATIVE_API


async def test_a_merged_write_retried_with_its_idempotency_key_is_answered_without_merging_again() -> None:
    db = MemoryDatabase()
    first = await write_memory(a_write("I prefer window seats."), FakeUnitOfWork(db), now=NOW)
    merged = await write_memory(a_write("i prefer window seats", idempotency_key="k-2"), FakeUnitOfWork(db), now=NOW)
    retried = await write_memory(a_write("i prefer window seats", idempotency_key="k-2"), FakeUnitOfWork(db), now=NOW)
    assert merged.status is WriteStatus.MERGED and retried.memory_id == first.memory_id
    assert retried.status is WriteStatus.DUPLICATE and retried.duplicate
    kept = db.rows[first.memory_id]
    assert kept.merged_count == 1 and kept.engagement == 1.0  # one merge, one engagement bump
    assert len([e for _, e in db.published if isinstance(e, MemoryMerged)]) == 1
    with pytest.raises(IdempotencyKeyReused):  # the key is taken by that write: new content needs a new key
        await write_memory(a_write("something else", idempotency_key="k-2"), FakeUnitOfWork(db), now=NOW)


async def test_identical_content_in_another_layer_or_of_another_user_is_not_merged() -> None:
    db = MemoryDatabase()
    await write_memory(a_write("likes jazz"), FakeUnitOfWork(db), now=NOW)
    other_layer = await write_memory(a_write("likes jazz", layer=Layer.SHORT_TERM), FakeUnitOfWork(db), now=NOW)
    other_user = await write_memory(a_write("likes jazz", user_id="u2"), FakeUnitOfWork(db), now=NOW)
    assert other_layer.status is other_user.status is WriteStatus.STORED and len(db.rows) == 3


async def test_a_near_duplicate_is_stored_and_linked_to_the_memory_it_resembles_in_both_languages() -> None:
    db = MemoryDatabase()
    for original, variant in [("I prefer window seats on long flights", "I prefer window seats on long flights!!"
                               " please"), ("我喜欢靠窗的座位，长途飞行时", "我喜欢靠窗的座位，长途飞行的时候")]:
        first = await write_memory(a_write(original), FakeUnitOfWork(db), now=NOW)
        near = await write_memory(a_write(variant), FakeUnitOfWork(db), now=NOW)
        assert near.status is WriteStatus.STORED and near.near_duplicate_of == first.memory_id
        assert db.rows[near.memory_id].near_duplicate_of == first.memory_id
    unrelated = await write_memory(a_write("drinks coffee black"), FakeUnitOfWork(db), now=NOW)
    assert unrelated.near_duplicate_of == ""


@given(st.text(min_size=1, max_size=80))
def test_normalised_equal_texts_share_their_digest_and_signature(text) -> None:
    wide = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)
    assert content_digest(text.upper() + " ,.") == content_digest(text.upper())
    assert content_digest(wide) == content_digest(text)
    assert similarity(minhash(wide), minhash(text)) == 1.0


def test_unrelated_texts_are_far_below_the_near_duplicate_threshold() -> None:
    assert similarity(minhash("用户住在杭州西湖区"), minhash("prefers aisle seats")) < NEAR_THRESHOLD / 2


@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=64, max_size=64),
       st.text(min_size=1, max_size=20), st.sampled_from([1, 3, 5]))
def test_bands_and_lsh_keys_are_the_stored_formula(signature, user_id, layer) -> None:
    """Stored `lsh` arrays (and migration 0108's SQL) use these keys: the fast paths must not change them."""
    expected_bands = [f"{i}:" + hashlib.blake2b(struct.pack(">4I", *signature[i * 4:(i + 1) * 4]),
                                                digest_size=8).hexdigest() for i in range(16)]
    assert bands(signature) == expected_bands
    expected_keys = [int.from_bytes(hashlib.sha256(f"{user_id}|{layer}|{b}".encode()).digest()[:8], "big",
                                    signed=True) for b in expected_bands]
    assert lsh_keys(user_id, layer, signature) == expected_keys
    assert [lsh_key(user_id, layer, b) for b in expected_bands] == expected_keys


@given(st.lists(st.text(max_size=120), max_size=30), st.integers(min_value=1, max_value=400))
def test_signatures_of_a_batch_equal_those_computed_one_by_one(texts, chunk) -> None:
    original = similarity_module._CHUNK
    similarity_module._CHUNK = chunk  # small chunks too: a batch split across several vectorised passes
    try:
        assert minhash_many(texts) == [minhash(t) for t in texts]
    finally:
        similarity_module._CHUNK = original
