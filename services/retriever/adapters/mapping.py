"""Protobuf <-> retriever domain."""

from __future__ import annotations

from datetime import UTC

from google.protobuf import timestamp_pb2

from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2
from libs.text import tokenize
from services.retriever.domain import Document, Hit, SearchQuery

__all__ = ["document_from_proto", "hit_to_proto", "query_from_proto"]


def _dt(ts: timestamp_pb2.Timestamp, present: bool):
    return ts.ToDatetime(tzinfo=UTC) if present else None


def document_from_proto(m: common_pb2.Memory) -> Document:
    return Document(
        memory_id=m.memory_id, tenant_id=m.tenant.tenant_id, user_id=m.tenant.user_id,
        session_id=m.tenant.session_id, layer=m.layer, source=m.source, confidence=m.confidence,
        content=m.content, terms=tuple(dict.fromkeys(tokenize(m.content + " " + m.key))), tags=tuple(m.tags),
        created_at=m.created_at.ToDatetime(tzinfo=UTC), expires_at=_dt(m.expires_at, m.HasField("expires_at")),
    )


def query_from_proto(r: memory_pb2.SearchRequest) -> SearchQuery:
    return SearchQuery(
        tenant_id=r.tenant.tenant_id, user_id=r.tenant.user_id, text=r.query, limit=r.limit,
        layers=tuple(r.layers), tags=tuple(r.tags), since=_dt(r.since, r.HasField("since")),
        until=_dt(r.until, r.HasField("until")), min_confidence=r.min_confidence,
    )


def hit_to_proto(h: Hit) -> memory_pb2.SearchHit:
    d = h.document
    created, expires = timestamp_pb2.Timestamp(), None
    created.FromDatetime(d.created_at)
    if d.expires_at:
        expires = timestamp_pb2.Timestamp()
        expires.FromDatetime(d.expires_at)
    memory = common_pb2.Memory(
        memory_id=d.memory_id, layer=d.layer, source=d.source, confidence=d.confidence, content=d.content,
        tags=list(d.tags), created_at=created, expires_at=expires,
        tenant=common_pb2.TenantContext(tenant_id=d.tenant_id, user_id=d.user_id, session_id=d.session_id),
    )
    return memory_pb2.SearchHit(memory=memory, score=h.score, must_confirm=h.must_confirm, age_seconds=h.age_seconds)
