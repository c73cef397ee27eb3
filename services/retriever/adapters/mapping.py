"""Protobuf <-> retriever domain. Request validation lives in SearchQuery.validated (the domain)."""

from __future__ import annotations

from datetime import UTC

from google.protobuf import json_format, timestamp_pb2

from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2
from services.retriever.domain import Document, Hit, SearchQuery
from services.retriever.domain.structured import Condition, StructuredQuery

__all__ = ["condition_to_proto", "document_from_proto", "hit_to_proto", "memory_to_proto", "query_from_proto",
           "structured_query_from_proto"]


def _dt(ts: timestamp_pb2.Timestamp, present: bool):
    return ts.ToDatetime(tzinfo=UTC) if present else None


# Statuses kept out of default search (include_archived finds them): a candidate is not served until
# confirmed, a superseded value is kept for History, an archived one is idle.
_OUT_OF_DEFAULT_SEARCH = {common_pb2.MEMORY_STATUS_CANDIDATE, common_pb2.MEMORY_STATUS_SUPERSEDED,
                          common_pb2.MEMORY_STATUS_ARCHIVED}


def document_from_proto(m: common_pb2.Memory, *, archived: bool = False) -> Document:
    return Document(
        memory_id=m.memory_id, tenant_id=m.tenant.tenant_id, user_id=m.tenant.user_id,
        session_id=m.tenant.session_id, layer=m.layer, source=m.source, confidence=m.confidence,
        content=m.content, terms=(), tags=tuple(m.tags),
        created_at=m.created_at.ToDatetime(tzinfo=UTC), expires_at=_dt(m.expires_at, m.HasField("expires_at")),
        key=m.key, derived_from=tuple(m.derived_from), engagement=m.engagement,
        archived=archived or m.status in _OUT_OF_DEFAULT_SEARCH,
        step_id=m.step_id, attributes=json_format.MessageToDict(m.attributes) if m.HasField("attributes") else {},
    )


def query_from_proto(r: memory_pb2.SearchRequest, tenant_id: str | None = None) -> SearchQuery:
    """`tenant_id`: the caller's, from its token (the auth interceptor has checked the request names it)."""
    defaults = SearchQuery(tenant_id="", user_id="", text="")

    def opt(name: str) -> float:
        return getattr(r, name) if r.HasField(name) else getattr(defaults, name)

    return SearchQuery(
        tenant_id=tenant_id or r.tenant.tenant_id, user_id=r.tenant.user_id, session_id=r.tenant.session_id,
        text=r.query, limit=r.limit, layers=tuple(r.layers), tags=tuple(r.tags),
        since=_dt(r.since, r.HasField("since")), until=_dt(r.until, r.HasField("until")),
        min_confidence=r.min_confidence, mode=r.mode or "full", fusion=r.fusion or defaults.fusion,
        include_archived=r.include_archived, two_stage=r.two_stage, candidates=r.candidates or defaults.candidates,
        recency_weight=opt("recency_weight"), confidence_weight=opt("confidence_weight"),
        engagement_weight=opt("engagement_weight"), half_life_days=opt("half_life_days"),
        dense_weight=opt("dense_weight"), route=r.route,
    )


def structured_query_from_proto(r: memory_pb2.QueryRequest) -> StructuredQuery:
    """The tenant is the request's, which the auth interceptor has set to the token's."""
    return StructuredQuery(
        tenant_id=r.tenant.tenant_id, user_id=r.tenant.user_id, session_id=r.tenant.session_id,
        conditions=tuple(Condition(c.field, c.op, json_format.MessageToDict(c.value) if c.HasField("value") else None)
                         for c in r.where),
        limit=r.limit, include_archived=r.include_archived, order_by=r.order_by, ascending=r.ascending)


def condition_to_proto(c: Condition) -> memory_pb2.QueryCondition:
    out = memory_pb2.QueryCondition(field=c.field, op=c.op)
    if c.value is not None:
        json_format.ParseDict(c.value, out.value)
    return out


def memory_to_proto(d: Document) -> common_pb2.Memory:
    created, expires = timestamp_pb2.Timestamp(), None
    created.FromDatetime(d.created_at)
    if d.expires_at:
        expires = timestamp_pb2.Timestamp()
        expires.FromDatetime(d.expires_at)
    memory = common_pb2.Memory(
        memory_id=d.memory_id, layer=d.layer, source=d.source, confidence=d.confidence, content=d.content,
        key=d.key, tags=list(d.tags), created_at=created, expires_at=expires, engagement=d.engagement,
        derived_from=list(d.derived_from), step_id=d.step_id,
        tenant=common_pb2.TenantContext(tenant_id=d.tenant_id, user_id=d.user_id, session_id=d.session_id),
    )
    if d.attributes:
        memory.attributes.update(d.attributes)
    return memory


def hit_to_proto(h: Hit) -> memory_pb2.SearchHit:
    return memory_pb2.SearchHit(memory=memory_to_proto(h.document), score=h.score, must_confirm=h.must_confirm,
                                age_seconds=h.age_seconds, dense_score=h.dense, sparse_score=h.sparse,
                                fused_score=h.fused, recency=h.recency, exact=h.exact)
