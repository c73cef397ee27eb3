"""The retriever's query rules, ranking and tokenisation, and its handlers over fake ports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fakes import FakeDocumentStore, FakeVectorIndex

from libs.errors import ValidationFailed
from libs.text import tokenize
from services.retriever.domain import Document, SearchQuery, rank
from services.retriever.service_layer.handlers import CANDIDATES, forget_documents, index_document, search

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def a_doc(memory_id: str, content: str, *, confidence: int = 1, age: timedelta = timedelta(0),
          expires_at: datetime | None = None, tenant_id: str = "acme") -> Document:
    return Document(memory_id=memory_id, tenant_id=tenant_id, user_id="u1", session_id="s1", layer=5, source=2,
                    confidence=confidence, content=content, terms=tuple(dict.fromkeys(tokenize(content))),
                    tags=(), created_at=NOW - age, expires_at=expires_at)


def a_query(text: str, **kw) -> SearchQuery:
    return SearchQuery(tenant_id="acme", user_id="u1", text=text, **kw).validated()


# --- tokenize ----------------------------------------------------------------------------------------------


def test_chinese_text_becomes_single_characters_then_overlapping_bigrams() -> None:
    assert tokenize("我的电话号码") == ["我", "的", "电", "话", "号", "码", "我的", "的电", "电话", "话号", "号码"]


def test_english_words_are_lower_cased_whole_and_punctuation_is_dropped() -> None:
    assert tokenize("Call ME, maybe? snake_case") == ["call", "me", "maybe", "snake", "case"]


def test_mixed_text_splits_latin_words_from_chinese_runs() -> None:
    assert tokenize("Call 我的phone") == ["call", "我", "的", "我的", "phone"]
    assert tokenize("abc电话") == ["abc", "电", "话", "电话"]


def test_full_width_letters_and_digits_are_normalised_to_ascii() -> None:
    assert tokenize("ＡＢＣ１２３ Ｈｅｌｌｏ") == ["abc123", "hello"]


def test_text_with_no_words_has_no_terms() -> None:
    assert tokenize("  ?! -- ,,, ") == []


# --- SearchQuery.validated ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "bad_field"), [
    ({"tenant_id": ""}, "tenant.tenant_id"),
    ({"text": "   "}, "query"),
    ({"text": "?! ..."}, "query"),
    ({"limit": -1}, "limit"),
    ({"limit": 101}, "limit"),
    ({"text": "\u200b\ufeff"}, "query"),
    ({"layers": (5, 99)}, "layers[1]"),
    ({"min_confidence": 99}, "min_confidence"),
])
def test_a_bad_query_is_refused_naming_the_field(changes: dict, bad_field: str) -> None:
    query = SearchQuery(**{"tenant_id": "acme", "user_id": "u1", "text": "phone", **changes})
    with pytest.raises(ValidationFailed) as err:
        query.validated()
    assert err.value.field == bad_field


def test_a_query_without_a_limit_returns_ten_and_its_terms_are_deduplicated() -> None:
    query = SearchQuery(tenant_id="acme", user_id="u1", text="Phone phone PHONE number", limit=0).validated()
    assert query.limit == 10
    assert query.terms == ("phone", "number")


# --- rank --------------------------------------------------------------------------------------------------


def test_expired_documents_are_never_returned() -> None:
    docs = [a_doc("gone", "phone number", expires_at=NOW - timedelta(seconds=1)),
            a_doc("just-gone", "phone number", expires_at=NOW),
            a_doc("alive", "phone number", expires_at=NOW + timedelta(seconds=1))]
    assert [h.document.memory_id for h in rank(a_query("phone number"), docs, NOW)] == ["alive"]


def test_the_score_is_the_share_of_query_terms_a_fresh_strong_document_contains() -> None:
    docs = [a_doc("half", "my phone"), a_doc("full", "phone number here"), a_doc("none", "tea")]
    hits = rank(a_query("phone number"), docs, NOW)
    assert [(h.document.memory_id, h.score) for h in hits] == [("full", pytest.approx(1.0)),
                                                               ("half", pytest.approx(0.5))]


def test_a_medium_confidence_hit_must_be_confirmed_and_a_strong_one_need_not() -> None:
    hits = {h.document.memory_id: h for h in rank(a_query("phone"),
                                                  [a_doc("l1", "phone", confidence=1),
                                                   a_doc("l2", "phone", confidence=2)], NOW)}
    assert hits["l2"].must_confirm and not hits["l1"].must_confirm
    assert hits["l1"].score > hits["l2"].score


def test_a_newer_document_beats_an_older_one_at_equal_overlap() -> None:
    docs = [a_doc("old", "phone", age=timedelta(days=60)), a_doc("new", "phone", age=timedelta(days=1))]
    hits = rank(a_query("phone"), docs, NOW)
    assert [h.document.memory_id for h in hits] == ["new", "old"]
    assert hits[1].age_seconds == pytest.approx(60 * 86400)


def test_a_strong_document_beats_a_weak_one_at_equal_overlap_and_age() -> None:
    hits = rank(a_query("phone"), [a_doc("weak", "phone", confidence=3), a_doc("strong", "phone")], NOW)
    assert [h.document.memory_id for h in hits] == ["strong", "weak"]


def test_rank_returns_at_most_the_query_limit_best_first() -> None:
    docs = [a_doc(f"d{i}", "phone", age=timedelta(days=i)) for i in range(5)]
    hits = rank(a_query("phone", limit=2), docs, NOW)
    assert [h.document.memory_id for h in hits] == ["d0", "d1"]


# --- handlers ----------------------------------------------------------------------------------------------


async def test_an_indexed_chinese_memory_is_found_by_a_chinese_query() -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "我的电话号码是 13800000000"), store)
    await index_document(a_doc("m2", "我喜欢喝茶"), store)

    hits = await search(SearchQuery(tenant_id="acme", user_id="u1", text="电话号码"), store, now=NOW)

    assert [h.document.memory_id for h in hits] == ["m1"]
    asked, limit = store.queries[0]
    assert asked.terms == ("电", "话", "号", "码", "电话", "话号", "号码")
    assert limit == CANDIDATES


async def test_search_drops_documents_that_expired_by_the_time_given() -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "phone", expires_at=NOW + timedelta(hours=1)), store)
    assert len(await search(SearchQuery("acme", "u1", "phone"), store, now=NOW)) == 1
    assert await search(SearchQuery("acme", "u1", "phone"), store, now=NOW + timedelta(hours=2)) == []


async def test_an_invalid_search_is_refused_before_the_store_is_asked() -> None:
    store = FakeDocumentStore()
    with pytest.raises(ValidationFailed):
        await search(SearchQuery(tenant_id="acme", user_id="u1", text=""), store, now=NOW)
    assert store.queries == []


async def test_reindexing_a_memory_replaces_its_document() -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "phone"), store)
    await index_document(a_doc("m1", "email"), store)
    assert await search(SearchQuery("acme", "u1", "phone"), store, now=NOW) == []
    assert len(await search(SearchQuery("acme", "u1", "email"), store, now=NOW)) == 1


async def test_forgetting_documents_removes_them_from_the_store_and_the_vector_index() -> None:
    store, index = FakeDocumentStore(), FakeVectorIndex()
    for memory_id in ("m1", "m2", "m3"):
        await index_document(a_doc(memory_id, "phone"), store)
        index.points[memory_id] = "acme"

    assert await forget_documents("acme", ["m1", "m2", "missing"], store, index) == 2

    assert list(store.documents) == ["m3"]
    assert index.count("acme") == 1
    assert [h.document.memory_id for h in await search(SearchQuery("acme", "u1", "phone"), store, now=NOW)] \
        == ["m3"]
