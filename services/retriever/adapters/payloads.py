"""What the vector index stores beside the vectors (the payload), and what one search asks it; shared by
both engines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from services.retriever.domain import Document, SearchQuery, SparseVector, redact

__all__ = ["COLLECTION", "DENSE_SIZE", "IndexQuery", "document_of", "payload_of"]

DENSE_SIZE = 512  # the default embedder's (use-multilingual); the index takes the embedder's size
COLLECTION = "memories"


def _clean(text: str) -> bool:
    return redact(text) == text


def payload_of(d: Document) -> dict:
    payload = {"tenant_id": d.tenant_id, "memory_id": d.memory_id, "user_id": d.user_id, "session_id": d.session_id,
               "layer": d.layer, "confidence": d.confidence, "tags": list(d.tags),
               "archived": int(d.archived),  # 0/1: qdrant-edge 0.9 matches no boolean payload with MatchValue(True)
               "created_at": d.created_at.timestamp(),
               "expires_at": d.expires_at.timestamp() if d.expires_at else None,
               "source": d.source, "derived_from": list(d.derived_from), "engagement": d.engagement,
               "step_id": d.step_id}
    if _clean(d.content) and _clean(d.key) and _clean(json.dumps(d.attributes, ensure_ascii=False)):
        payload.update(content=d.content, key=d.key, attributes=d.attributes, complete=True)
    else:  # a sensitive value stays in PostgreSQL only: the hit is read back from there
        payload["complete"] = False
    return payload


def document_of(payload: dict) -> Document | None:
    """The document a complete payload carries (None: read it back from PostgreSQL)."""
    if not payload.get("complete"):
        return None
    expires = payload.get("expires_at")
    return Document(
        memory_id=payload["memory_id"], tenant_id=payload["tenant_id"], user_id=payload["user_id"],
        session_id=payload["session_id"], layer=payload["layer"], source=payload["source"],
        confidence=payload["confidence"], content=payload["content"], terms=(), tags=tuple(payload["tags"]),
        created_at=datetime.fromtimestamp(payload["created_at"], UTC),
        expires_at=datetime.fromtimestamp(expires, UTC) if expires is not None else None, key=payload["key"],
        derived_from=tuple(payload["derived_from"]), engagement=payload["engagement"],
        archived=bool(payload["archived"]), step_id=payload["step_id"], attributes=payload["attributes"] or {})


@dataclass(frozen=True)
class IndexQuery:
    """What one search asks the index: the filters, a dense and/or a sparse query vector."""

    query: SearchQuery
    dense: list[float] | None
    sparse: SparseVector | None
    now: datetime
    limit: int
    two_stage: bool = False  # sparse candidates, then dense re-ranking of those only
