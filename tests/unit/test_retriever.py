"""The retriever's query rules, BM25 terms, fusion and rescoring, and its handlers over fake ports."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FakeDocumentStore, FakeVectorIndex

from libs.errors import ValidationFailed
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2
from libs.text import tokenize
from services.retriever.adapters.embedders import HashEmbedder
from services.retriever.adapters.mapping import document_from_proto, hit_to_proto, query_from_proto
from services.retriever.domain import Bm25, Candidate, Document, SearchQuery, fuse, redact, rescore, terms
from services.retriever.domain.sparse import term_id
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval, forget_documents, index_document, search

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def a_doc(memory_id: str, content: str, *, confidence: int = 1, age: timedelta = timedelta(0),
          expires_at: datetime | None = None, tenant_id: str = "acme", user_id: str = "u1", layer: int = 5,
          archived: bool = False, tags: tuple[str, ...] = ()) -> Document:
    return Document(memory_id=memory_id, tenant_id=tenant_id, user_id=user_id, session_id="s1", layer=layer,
                    source=2, confidence=confidence, content=content, terms=(), tags=tags,
                    created_at=NOW - age, expires_at=expires_at, archived=archived)


def a_query(text: str, **kw) -> SearchQuery:
    return SearchQuery(tenant_id="acme", user_id="u1", text=text, **kw).validated()


class RecordingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return super().embed(texts)


@pytest.fixture
def retrieval() -> Retrieval:
    return Retrieval(FakeVectorIndex(), BatchingEmbedder(RecordingEmbedder()), Bm25())


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
    ({"limit": -1}, "limit"),
    ({"limit": 101}, "limit"),
    ({"text": "\u200b\ufeff"}, "query"),
    ({"layers": (5, 99)}, "layers[1]"),
    ({"min_confidence": 99}, "min_confidence"),
    ({"mode": "fuzzy"}, "mode"),
    ({"fusion": "max"}, "fusion"),
    ({"recency_weight": 1.5}, "recency_weight"),
    ({"recency_weight": 0.6, "confidence_weight": 0.6}, "recency_weight"),
    ({"half_life_days": 0}, "half_life_days"),
    ({"since": NOW, "until": NOW}, "until"),
])
def test_a_bad_query_is_refused_naming_the_field(changes: dict, bad_field: str) -> None:
    query = SearchQuery(**{"tenant_id": "acme", "user_id": "u1", "text": "phone", **changes})
    with pytest.raises(ValidationFailed) as err:
        query.validated()
    assert err.value.field == bad_field


def test_a_query_without_a_limit_returns_ten_in_full_mode_with_score_fusion() -> None:
    query = SearchQuery(tenant_id="acme", user_id="u1", text="phone", limit=0, mode="", fusion="").validated()
    assert (query.limit, query.mode, query.fusion) == (10, "full", "score")


# --- BM25 terms and vectors ----------------------------------------------------------------------------------


def test_chinese_is_segmented_into_words_and_their_sub_words_with_jieba() -> None:
    assert terms("我的电话号码是多少") == ["电话", "号码", "电话号码"]


def test_english_terms_drop_stop_words_and_fold_plurals() -> None:
    assert terms("What does Maya's tutor teach? Meetings and cities") == ["maya", "tutor", "teach", "meeting",
                                                                          "city"]


def test_the_bigram_segmenter_is_the_dictionary_free_floor() -> None:
    assert terms("电话号码", "bigram") == ["电", "话", "号", "码", "电话", "话号", "号码"]


def test_a_longer_memory_weighs_a_shared_term_less_and_repeats_saturate() -> None:
    bm25 = Bm25(avg_len=4)
    short, long = bm25.document("passport renewal"), bm25.document("passport " + "travel plans " * 6)
    weight = {True: dict(zip(short.indices, short.values, strict=True)),
              False: dict(zip(long.indices, long.values, strict=True))}
    assert weight[True][term_id("passport")] > weight[False][term_id("passport")]
    once, many = bm25.document("visa"), bm25.document("visa " * 20)
    assert once.values[0] < many.values[0] < bm25.k1 + 1


def test_a_query_vector_has_one_unit_weight_per_distinct_term() -> None:
    q = Bm25().query("passport passport visa")
    assert sorted(q.indices) == sorted({term_id("passport"), term_id("visa")}) and q.values == (1.0, 1.0)


@pytest.mark.parametrize("secret", ["13800138000", "6222 0212 3456 7890", "11010519491231002X",
                                    "zhang.san@example.com", "sk-abcdefghijklmnop1234"])
def test_sensitive_values_are_redacted_before_indexing(secret: str) -> None:
    assert secret not in redact(f"my value is {secret} ok")
    assert not set(Bm25().document(f"value {secret}").indices) & {term_id(t) for t in terms(secret)}


# --- fusion and rescoring ------------------------------------------------------------------------------------


def test_rrf_ranks_a_memory_both_retrievers_found_above_one_found_by_one_only() -> None:
    fused = fuse([("a", 0.9), ("b", 0.8)], [("b", 5.0), ("c", 4.0)], a_query("x", fusion="rrf"))
    assert [c.memory_id for c in fused][0] == "b"
    assert fused[0] == Candidate("b", 0.8, 5.0, pytest.approx(1 / 62 + 1 / 61))


def test_score_fusion_weighs_normalised_scores_by_the_dense_weight() -> None:
    dense, sparse = [("a", 0.9), ("b", 0.5)], [("b", 8.0), ("a", 2.0)]
    assert fuse(dense, sparse, a_query("x", fusion="score", dense_weight=0.8))[0].memory_id == "a"
    assert fuse(dense, sparse, a_query("x", fusion="score", dense_weight=0.2))[0].memory_id == "b"


def test_rescoring_drops_expired_and_archived_memories_unless_archived_ones_are_asked_for() -> None:
    docs = {"gone": a_doc("gone", "x", expires_at=NOW), "old": a_doc("old", "x", archived=True),
            "ok": a_doc("ok", "x")}
    candidates = [Candidate(m, 0.5, None, 1.0) for m in docs]
    assert [h.document.memory_id for h in rescore(a_query("x"), candidates, docs, NOW)] == ["ok"]
    with_archive = rescore(a_query("x", include_archived=True), candidates, docs, NOW)
    assert {h.document.memory_id for h in with_archive} == {"ok", "old"}


def test_full_mode_prefers_the_newer_stronger_memory_at_equal_fused_score_and_hybrid_does_not_rescore() -> None:
    docs = {"old": a_doc("old", "x", age=timedelta(days=90)), "new": a_doc("new", "x", age=timedelta(days=1)),
            "weak": a_doc("weak", "x", confidence=3, age=timedelta(days=1))}
    candidates = [Candidate(m, 0.5, None, 1.0) for m in ("old", "weak", "new")]
    full = rescore(a_query("x", mode="full"), candidates, docs, NOW)
    assert [h.document.memory_id for h in full] == ["new", "weak", "old"]
    assert full[2].recency == pytest.approx(2 ** -3)
    hybrid = rescore(a_query("x", mode="hybrid"), candidates, docs, NOW)
    assert {h.score for h in hybrid} == {1.0}


def test_a_medium_confidence_hit_must_be_confirmed_and_a_strong_one_need_not() -> None:
    docs = {"l1": a_doc("l1", "x", confidence=1), "l2": a_doc("l2", "x", confidence=2)}
    hits = {h.document.memory_id: h for h in rescore(a_query("x"), [Candidate(m, fused=1.0) for m in docs], docs,
                                                     NOW)}
    assert hits["l2"].must_confirm and not hits["l1"].must_confirm


# --- handlers ----------------------------------------------------------------------------------------------


async def test_an_indexed_chinese_memory_is_found_by_a_chinese_keyword_query(retrieval: Retrieval) -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "我的电话号码换了"), store, retrieval)
    await index_document(a_doc("m2", "我喜欢喝茶"), store, retrieval)

    hits = await search(a_query("电话号码", mode="sparse"), store, retrieval, now=NOW)

    assert [h.document.memory_id for h in hits] == ["m1"]
    assert hits[0].sparse is not None and hits[0].dense is None


async def test_search_passes_every_filter_to_the_index_and_returns_only_what_passes(retrieval: Retrieval) -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("mine", "passport renewal", tags=("travel",)), store, retrieval)
    await index_document(a_doc("other-user", "passport renewal", user_id="u2", tags=("travel",)), store, retrieval)
    await index_document(a_doc("other-layer", "passport renewal", layer=1, tags=("travel",)), store, retrieval)
    await index_document(a_doc("untagged", "passport renewal"), store, retrieval)
    await index_document(a_doc("old", "passport renewal", age=timedelta(days=40), tags=("travel",)), store,
                         retrieval)

    hits = await search(a_query("passport", layers=(5,), tags=("travel",), since=NOW - timedelta(days=30)),
                        store, retrieval, now=NOW)

    assert [h.document.memory_id for h in hits] == ["mine"]


async def test_an_expired_memory_leaves_search_when_its_time_comes(retrieval: Retrieval) -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "phone", expires_at=NOW + timedelta(hours=1)), store, retrieval)
    assert len(await search(a_query("phone"), store, retrieval, now=NOW)) == 1
    assert await search(a_query("phone"), store, retrieval, now=NOW + timedelta(hours=2)) == []


async def test_an_invalid_search_is_refused_before_the_index_is_asked(retrieval: Retrieval) -> None:
    with pytest.raises(ValidationFailed):
        await search(SearchQuery(tenant_id="acme", user_id="u1", text=""), FakeDocumentStore(), retrieval, now=NOW)
    with pytest.raises(ValidationFailed) as err:
        await search(a_query("?!", mode="sparse"), FakeDocumentStore(), retrieval, now=NOW)
    assert err.value.field == "query"
    assert retrieval.index.queries == []


async def test_reindexing_a_memory_replaces_it_in_both_stores(retrieval: Retrieval) -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("m1", "phone"), store, retrieval)
    await index_document(a_doc("m1", "email"), store, retrieval)
    assert await search(a_query("phone", mode="sparse"), store, retrieval, now=NOW) == []
    assert len(await search(a_query("email", mode="sparse"), store, retrieval, now=NOW)) == 1
    assert retrieval.index.count("acme") == 1


async def test_forgetting_removes_memories_from_the_store_and_the_index_and_they_never_come_back(
    retrieval: Retrieval,
) -> None:
    store = FakeDocumentStore()
    for memory_id in ("m1", "m2", "m3"):
        await index_document(a_doc(memory_id, "phone"), store, retrieval)

    assert await forget_documents("acme", ["m1", "m2", "missing"], store, retrieval.index) == 2
    assert await index_document(a_doc("m1", "phone"), store, retrieval) is False  # a late memory.written

    assert list(store.documents) == ["m3"] and retrieval.index.count("acme") == 1
    assert [h.document.memory_id for h in await search(a_query("phone"), store, retrieval, now=NOW)] == ["m3"]


async def test_sensitive_values_never_reach_the_embedder_nor_the_index(retrieval: Retrieval) -> None:
    await index_document(a_doc("m1", "my bank card is 6222021234567890"), FakeDocumentStore(), retrieval)
    embedder = retrieval.embedder.embedder
    assert embedder.calls and all("6222021234567890" not in t for call in embedder.calls for t in call)
    (_, _, sparse), = retrieval.index.points.values()
    assert term_id("6222021234567890") not in sparse.indices


async def test_two_stage_retrieval_gives_the_same_top_results_where_the_candidates_hold_them(
    retrieval: Retrieval,
) -> None:
    """Where the sparse candidate stage keeps every memory the dense ranking needs (here: each shares a query
    term), dense re-ranking of the candidates equals one-stage hybrid retrieval."""
    store = FakeDocumentStore()
    for n, text in enumerate(["passport renewal at the embassy", "passport photo booth", "renewal of the lease",
                              "embassy opening hours", "tea at the embassy with grandmother"]):
        await index_document(a_doc(f"m{n}", text), store, retrieval)
    one = await search(a_query("passport renewal embassy", mode="hybrid"), store, retrieval, now=NOW)
    two = await search(a_query("passport renewal embassy", mode="hybrid", two_stage=True), store, retrieval, now=NOW)
    assert [h.document.memory_id for h in one][:3] == [h.document.memory_id for h in two][:3]
    assert retrieval.index.queries[-1].two_stage


async def test_concurrent_embeddings_are_coalesced_into_model_sized_batches() -> None:
    model = RecordingEmbedder()
    batching = BatchingEmbedder(model, max_batch=8)
    vectors = await asyncio.gather(*(batching.embed([f"text {n}"]) for n in range(20)))
    assert len(vectors) == 20 and all(len(v) == 1 for v in vectors)
    assert [len(c) for c in model.calls] == [8, 8, 4]


async def test_the_model_takes_its_next_batch_while_the_event_loop_is_busy() -> None:
    """The model's thread hands itself the next batch: a loop busy elsewhere (here blocked outright) does not
    leave the model idle between batches."""
    done: list[float] = []

    class Slow(RecordingEmbedder):
        def embed(self, texts: list[str]) -> list[list[float]]:
            time.sleep(0.02)
            done.append(time.perf_counter())
            return super().embed(texts)

    batching = BatchingEmbedder(Slow(), max_batch=8)
    task = asyncio.create_task(batching.embed([f"text {n}" for n in range(24)]))
    await asyncio.sleep(0)  # the request is queued...
    await asyncio.sleep(0)  # ...and the model's thread woken
    time.sleep(1.0)  # the event loop is busy: no coroutine runs
    blocked_until = time.perf_counter()
    assert len(await task) == 24
    assert len(done) == 3 and all(t < blocked_until for t in done)  # all three batches ran meanwhile


async def test_a_failing_batch_fails_its_callers_only_and_the_model_goes_on() -> None:
    class Flaky(RecordingEmbedder):
        def embed(self, texts: list[str]) -> list[list[float]]:
            if any("poison" in t for t in texts):
                raise ValueError("cannot embed this")
            return super().embed(texts)

    batching = BatchingEmbedder(Flaky(), max_batch=2)
    bad, good = await asyncio.gather(batching.embed(["poison", "fine"]), batching.embed(["later", "too"]),
                                     return_exceptions=True)
    assert isinstance(bad, ValueError) and len(good) == 2
    assert len(await batching.embed(["again"])) == 1


# --- mapping -------------------------------------------------------------------------------------------------


def test_a_search_request_maps_with_defaults_for_unset_weights_and_its_own_when_set() -> None:
    request = memory_pb2.SearchRequest(tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1"),
                                       query="x", mode="hybrid", recency_weight=0.0, two_stage=True)
    q = query_from_proto(request)
    assert (q.mode, q.fusion, q.recency_weight, q.confidence_weight, q.two_stage) == (
        "hybrid", "score", 0.0, SearchQuery("", "", "").confidence_weight, True)


def test_a_hit_reports_its_components_provenance_and_whether_to_confirm() -> None:
    memory = common_pb2.Memory(memory_id="m1", tenant=common_pb2.TenantContext(tenant_id="acme"), content="x",
                               confidence=2, derived_from=["step-1"], key="user.city")
    memory.created_at.FromDatetime(NOW)
    doc = document_from_proto(memory)
    hit = hit_to_proto(rescore(a_query("x"), [Candidate("m1", 0.7, None, 1.0)], {"m1": doc}, NOW)[0])
    assert hit.must_confirm and list(hit.memory.derived_from) == ["step-1"] and hit.memory.key == "user.city"
    assert hit.HasField("dense_score") and not hit.HasField("sparse_score") and hit.dense_score == 0.7


# --- access events -------------------------------------------------------------------------------------------


async def test_returned_memories_are_reported_in_one_batch_per_user_and_kept_when_the_bus_is_down(
    retrieval: Retrieval,
) -> None:
    from services.retriever.service_layer.accesses import AccessBatcher

    published: list[tuple[str, str, list[str]]] = []
    down = True

    async def publish(tenant_id: str, user_id: str, memory_ids: list[str], at: datetime) -> None:
        if down:
            raise ConnectionRefusedError("Redis is down")
        published.append((tenant_id, user_id, sorted(memory_ids)))

    retrieval.accesses = AccessBatcher(publish)
    store = FakeDocumentStore()
    for memory_id in ("m1", "m2"):
        await index_document(a_doc(memory_id, "phone"), store, retrieval)
    for _ in range(3):
        await search(a_query("phone"), store, retrieval, now=NOW)

    assert await retrieval.accesses.flush() == 0 and published == []  # transient: kept
    down = False
    assert await retrieval.accesses.flush() == 2
    assert published == [("acme", "u1", ["m1", "m2"])]
    assert await retrieval.accesses.flush() == 0


async def test_a_hit_is_served_from_the_index_payload_but_sensitive_content_is_read_back_from_the_store(
    retrieval: Retrieval,
) -> None:
    store = FakeDocumentStore()
    await index_document(a_doc("plain", "my phone plan renews in May"), store, retrieval)
    await index_document(a_doc("secret", "my phone number is 13812345678"), store, retrieval)
    payloads = {m: p for m, (p, _, _) in retrieval.index.points.items()}
    assert payloads["plain"]["content"] == "my phone plan renews in May" and payloads["plain"]["complete"]
    assert "content" not in payloads["secret"] and not payloads["secret"]["complete"]
    fetched = []
    fetch = store.fetch

    async def spy(tenant_id: str, memory_ids: list[str]):
        fetched.extend(memory_ids)
        return await fetch(tenant_id, memory_ids)

    store.fetch = spy
    hits = {h.document.memory_id: h.document.content for h in await search(a_query("phone"), store, retrieval,
                                                                             now=NOW)}
    assert hits == {"plain": "my phone plan renews in May", "secret": "my phone number is 13812345678"}
    assert fetched == ["secret"]


async def test_recorded_memories_are_searchable_after_one_projection_batch_and_a_stale_version_is_refused(
    retrieval: Retrieval,
) -> None:
    from services.retriever.service_layer.handlers import project_pending, record_document

    store = FakeDocumentStore()
    for n in range(5):
        assert await record_document(a_doc(f"m{n}", f"passport renewal {n}"), store, retrieval, version=2)
    assert await search(a_query("passport"), store, retrieval, now=NOW) == []
    calls = len(retrieval.embedder.embedder.calls)
    assert await project_pending(store, retrieval) == 5
    assert len(retrieval.embedder.embedder.calls) == calls + 1  # one embedding call for the batch
    assert await record_document(a_doc("m0", "an older version, delivered late"), store, retrieval, version=1) is False
    assert await project_pending(store, retrieval) == 0
    assert {h.document.memory_id for h in await search(a_query("passport"), store, retrieval, now=NOW)} == {
        f"m{n}" for n in range(5)}


# --- every memory event kind keeps search in step --------------------------------------------------------

def _uuid(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def _written(memory_id: str, content: str, *, version: int = 1, status: int = 1, confidence: int = 1):
    from libs.events import Envelope
    from libs.protogen.mnemesh.v1 import events_pb2

    memory = common_pb2.Memory(memory_id=memory_id, layer=5, source=2, content=content, confidence=confidence,
                               status=status, tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1",
                                                                              session_id="s1"))
    memory.created_at.FromDatetime(NOW)
    return Envelope.wrap(events_pb2.MemoryWritten(memory=memory, version=version), event_type="memory.written",
                         tenant_id="acme")


def _event(kind: str, **fields):
    from libs.events import Envelope
    from libs.events.schema import EVENT_TYPES

    message_type = EVENT_TYPES[kind].message
    return Envelope.wrap(message_type(tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1"), **fields),
                         event_type=kind, tenant_id="acme")


async def test_each_memory_event_kind_updates_or_purges_what_search_returns(retrieval: Retrieval) -> None:
    from services.retriever.entrypoints.streams import on_memory_event
    from services.retriever.service_layer.handlers import project_pending

    store = FakeDocumentStore()
    handle = on_memory_event(lambda conn: store, retrieval)
    a, b, c, d, e, f, g = (_uuid(n) for n in range(1, 8))

    async def apply(*envelopes) -> set[str]:
        for envelope in envelopes:
            await handle(envelope, None)
        await project_pending(store, retrieval)
        return {h.document.memory_id for h in await search(a_query("passport"), store, retrieval, now=NOW)}

    async def archived_too() -> set[str]:
        hits = await search(a_query("passport", include_archived=True), store, retrieval, now=NOW)
        return {h.document.memory_id for h in hits}

    assert await apply(*(_written(m, f"passport number {m}") for m in (a, b, c, d, e, f))) == {a, b, c, d, e, f}
    assert await apply(_event("memory.expired", memory_ids=[a])) == {b, c, d, e, f}
    assert await apply(_written(a, "passport back again", version=2)) == {b, c, d, e, f}  # expiry is final
    assert await apply(_event("memory.archived", memory_ids=[b])) == {c, d, e, f}
    assert b in await archived_too() and retrieval.index.retrieve("acme", [b])[b]["archived"] == 1
    assert await apply(_written(g, "passport corrected value", version=1),
                       _event("memory.corrected", key="passport", old_memory_id=c, new_memory_id=g)) == {d, e, f, g}
    assert c in await archived_too()
    assert await apply(_event("memory.quarantined", memory_id=d)) == {e, f, g}
    assert d not in await archived_too()
    assert await apply(_event("memory.released", memory_id=d), _written(d, "passport released", version=2)) == {
        d, e, f, g}  # no tombstone: the release's memory.written indexes it again
    assert await apply(_written(e, "passport candidate", confidence=2, status=2)) == {d, f, g}  # not served yet
    await apply(_event("memory.confirmed", memory_id=e, key="passport", confidence=1, supersedes=g))
    hits = {h.document.memory_id: h for h in await search(a_query("passport"), store, retrieval, now=NOW)}
    assert set(hits) == {d, e, f} and hits[e].must_confirm is False and hits[e].document.confidence == 1
    await apply(_event("memory.merged", memory_id=f, engagement=3.0, tags=["travel"], merged_count=2))
    merged = store.documents[f]
    assert merged.engagement == 3.0 and merged.tags == ("travel",)
    assert retrieval.index.retrieve("acme", [f])[f]["engagement"] == 3.0
    assert await apply(_event("memory.session_compressed", summary_memory_id=d, covered_memory_ids=[f])) == {d, e, f}
    assert await apply(_event("memory.forgotten", memory_ids=[d, e, f])) == set()
    assert store.tombstones >= {a, d, e, f} and not store.unprojected
