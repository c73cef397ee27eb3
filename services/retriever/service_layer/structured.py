"""The structured path (`Retriever.Query`) and the memory router (`Search` with route auto / structured)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from libs.errors import ValidationFailed
from services.retriever.domain import Document, Hit, SearchQuery
from services.retriever.domain.router import Route, Vocabulary, route
from services.retriever.domain.search import L2_MEDIUM
from services.retriever.domain.structured import Condition, StructuredQuery
from services.retriever.service_layer.handlers import Retrieval, search
from services.retriever.service_layer.ports import DocumentStore, StructuredStore

__all__ = ["Routed", "Vocabularies", "query_memories", "routed_search"]

STRUCTURED_CANDIDATES = 200  # exact matches fetched when both paths run (ranked by the semantic one)
VOCABULARY_TTL = 30.0  # seconds a tenant's vocabulary is reused by the router


@dataclass(frozen=True)
class Routed:
    route: str  # semantic | structured | both
    conditions: tuple[Condition, ...]
    hits: list[Hit]


async def query_memories(q: StructuredQuery, queries: StructuredStore) -> tuple[list[Document], bool]:
    """Every memory of the tenant matching all conditions (validated first); and whether more matched."""
    return await queries.query(q.validated())


class Vocabularies:
    """The router's vocabulary per (tenant, user), reused for VOCABULARY_TTL: reading it scans the tenant's
    attributes, which a request per search must not repeat. One per process (the servicer holds it)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[float, Vocabulary]] = {}

    async def get(self, queries: StructuredStore, tenant_id: str, user_id: str) -> Vocabulary:
        now = time.monotonic()
        hit = self._cache.get((tenant_id, user_id))
        if hit is not None and now - hit[0] < VOCABULARY_TTL:
            return hit[1]
        vocabulary = await queries.vocabulary(tenant_id, user_id)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[(tenant_id, user_id)] = (now, vocabulary)
        return vocabulary


def _filters_as_conditions(q: SearchQuery, conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    """The search's own filters, for the structured path too: the same memories are eligible on both."""
    extra: list[Condition] = []
    if q.layers:
        extra.append(Condition("layer", "in", list(q.layers)))
    extra += [Condition("tags", "contains", t) for t in q.tags]
    if q.since:
        extra.append(Condition("created_at", "gte", q.since.isoformat()))
    if q.until:
        extra.append(Condition("created_at", "lt", q.until.isoformat()))
    if q.min_confidence:
        extra += [Condition("confidence", "gte", 1), Condition("confidence", "lte", q.min_confidence)]
    return conditions + tuple(extra)


def _exact_hit(d: Document, now: datetime) -> Hit:
    age = max((now - d.created_at).total_seconds(), 0.0)
    return Hit(d, 1.0, must_confirm=d.confidence == L2_MEDIUM, age_seconds=age, fused=1.0, exact=True)


async def routed_search(query: SearchQuery, store: DocumentStore, queries: StructuredStore, r: Retrieval,
                        vocabularies: Vocabularies, now: datetime | None = None) -> Routed:
    """Search as the request's route says. auto: the router reads the request against the tenant's
    vocabulary; no condition -> semantic search as usual; conditions only -> the structured path (newest
    first); conditions and content words -> both: exact matches ranked by the semantic score of the rest
    of the request first, then the other exact matches, then semantic hits that are not exact."""
    q = query.validated()
    now = now or datetime.now(UTC)
    if q.route == "semantic":
        return Routed("semantic", (), await search(q, store, r, now))
    plan: Route = route(q.text, await vocabularies.get(queries, q.tenant_id, q.user_id))
    if plan.path == "semantic":
        if q.route == "structured":
            raise ValidationFailed("names no entity key, attribute comparison or memory id the tenant's memories hold",
                                   field="query", hint="use route auto or semantic, or Retriever.Query with conditions")
        return Routed("semantic", (), await search(q, store, r, now))
    structured = StructuredQuery(
        q.tenant_id, _filters_as_conditions(q, plan.conditions), user_id=q.user_id, session_id=q.session_id,
        limit=STRUCTURED_CANDIDATES if plan.path == "both" else q.limit, include_archived=q.include_archived)
    documents, _ = await query_memories(structured, queries)
    if plan.path == "structured" or q.route == "structured":
        hits = [_exact_hit(d, now) for d in documents[: q.limit]]
        path = "structured"
    else:
        semantic = await search(replace(q, text=plan.rest, limit=q.limit, route="semantic"), store, r, now)
        exact = {d.memory_id: d for d in documents}
        ranked = [replace(h, exact=True) for h in semantic if h.document.memory_id in exact]
        seen = {h.document.memory_id for h in ranked}
        ranked += [_exact_hit(d, now) for d in documents if d.memory_id not in seen]
        ranked += [h for h in semantic if h.document.memory_id not in exact]
        hits, path = ranked[: q.limit], "both"
    if r.accesses is not None:
        r.accesses.record(q.tenant_id, hits)
    return Routed(path, plan.conditions, hits)
