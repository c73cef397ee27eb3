"""`mnemesh eval retrieval`: ingest conversations as memories, ask their questions, score the rankings.

Dataset format (JSON; services/retriever/evaluation/README.md has an example):
  {"conversations": [{"id", "user"?, "sessions": [{"id", "date" (ISO 8601), "turns": [{"id", "speaker", "text"}]}],
                      "questions"?: [...]}],
   "questions"?: [{"id"?, "conversation", "question", "evidence": [turn ids], "category"?}]}
Questions sit in their conversation or at the top level naming it. Each conversation is the
memory of its own user: one memory per turn ("speaker: text"), created at the session's date,
in the session it belongs to; questions search that user's memories only.
Metrics: recall@k, hit@k (k = 5, 10, 20), MRR and nDCG@10, per category and overall, per mode.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from libs.progress import progress_bar
from services.retriever.domain import Document, SearchQuery
from services.retriever.service_layer.handlers import Retrieval, index_document, search
from services.retriever.service_layer.ports import DocumentStore

__all__ = ["DATASET", "Dataset", "evaluate", "format_table", "load_dataset"]

DATASET = Path(__file__).with_name("dataset.json")
KS = (5, 10, 20)
TENANT = "eval"
SESSION_LAYER, USER_STATEMENT, L1_STRONG = 1, 2, 1
_NS = uuid.UUID("6f1c7e0a-2d4b-4f51-9a83-3c1f0d2b7e55")


@dataclass(frozen=True)
class Question:
    id: str
    conversation: str
    text: str
    evidence: tuple[str, ...]
    category: str


@dataclass(frozen=True)
class Dataset:
    conversations: list[dict]
    questions: list[Question]


def _date(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def load_dataset(path: Path | str) -> Dataset:
    """Read and check a dataset; a malformed one is refused naming the place."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    conversations = data.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        raise ValueError(f"{path}: 'conversations' must be a non-empty list")
    questions, turn_ids = [], set()
    for c in conversations:
        for s in c.get("sessions") or []:
            _date(s["date"])
            for t in s["turns"]:
                if not {"id", "speaker", "text"} <= t.keys():
                    raise ValueError(f"{path}: turn {t} needs id, speaker and text")
                turn_ids.add(str(t["id"]))
        for q in c.get("questions") or []:
            questions.append({**q, "conversation": c["id"]})
    questions += data.get("questions") or []
    out = []
    for n, q in enumerate(questions):
        missing = [e for e in q["evidence"] if str(e) not in turn_ids]
        if missing:
            raise ValueError(f"{path}: question {q.get('id', n)} names unknown evidence turns {missing}")
        out.append(Question(str(q.get("id", n)), str(q["conversation"]), q["question"],
                            tuple(str(e) for e in q["evidence"]), q.get("category") or "all"))
    if not out:
        raise ValueError(f"{path}: no questions")
    return Dataset(conversations, out)


def _memory_id(turn_id: str) -> str:
    return str(uuid.uuid5(_NS, turn_id))


def _documents(conversation: dict) -> list[Document]:
    out = []
    for s in conversation["sessions"]:
        start = _date(s["date"])
        previous = ""
        for n, t in enumerate(s["turns"]):
            out.append(Document(
                memory_id=_memory_id(str(t["id"])), tenant_id=TENANT, user_id=f"eval:{conversation['id']}",
                session_id=str(s["id"]), layer=SESSION_LAYER, source=USER_STATEMENT, confidence=L1_STRONG,
                content=f"{t['speaker']}: {t['text']}", terms=(), tags=(), created_at=start + timedelta(seconds=n),
                expires_at=None, attributes={"turn_id": str(t["id"]), "speaker": t["speaker"], "context": previous}))
            previous = f"{t['speaker']}: {t['text']}"
    return out


def _scores(ranked: list[str], evidence: tuple[str, ...]) -> dict[str, float]:
    relevant = set(evidence)
    out = {}
    for k in KS:
        found = len(relevant & set(ranked[:k]))
        out[f"recall@{k}"] = found / len(relevant)
        out[f"hit@{k}"] = float(found > 0)
    first = next((i for i, m in enumerate(ranked, 1) if m in relevant), None)
    out["mrr"] = 1.0 / first if first else 0.0
    dcg = sum(1 / math.log2(i + 1) for i, m in enumerate(ranked[:10], 1) if m in relevant)
    ideal = sum(1 / math.log2(i + 1) for i in range(1, min(len(relevant), 10) + 1))
    out["ndcg@10"] = dcg / ideal
    return out


async def evaluate(dataset: Dataset, store: DocumentStore, retrieval: Retrieval, *,
                   modes: tuple[str, ...] = ("dense", "sparse", "hybrid", "full"), progress: bool = True,
                   fusion: str = "") -> dict:
    """Ingest through the retriever's indexing path, then ask every question in every mode."""
    documents = [d for c in dataset.conversations for d in _documents(c)]
    for start in range(0, len(documents), 256):  # concurrent, so the embedder sees full batches
        await asyncio.gather(*(index_document(d, store, retrieval) for d in documents[start:start + 256]))
        if progress:
            progress_bar("ingest", min(start + 256, len(documents)), len(documents))
    last = {c["id"]: max(_date(s["date"]) for s in c["sessions"]) + timedelta(days=1) for c in dataset.conversations}
    turn_of = {d.memory_id: d.attributes["turn_id"] for d in documents}
    per: dict[str, dict[str, list[dict[str, float]]]] = {m: defaultdict(list) for m in modes}
    for n, q in enumerate(dataset.questions, 1):
        for mode in modes:
            hits = await search(SearchQuery(tenant_id=TENANT, user_id=f"eval:{q.conversation}", text=q.text,
                                            limit=max(KS), mode=mode, **({"fusion": fusion} if fusion else {})), store, retrieval, now=last[q.conversation])
            scores = _scores([turn_of[h.document.memory_id] for h in hits], q.evidence)
            per[mode][q.category].append(scores)
            per[mode]["overall"].append(scores)
        if progress:
            progress_bar("questions", n, len(dataset.questions))
    report = {mode: {cat: {k: round(sum(s[k] for s in rows) / len(rows), 4) for k in rows[0]} | {"n": len(rows)}
                     for cat, rows in cats.items()} for mode, cats in per.items()}
    return {"memories": len(documents), "questions": len(dataset.questions), "results": report}


def format_table(report: dict) -> str:
    metrics = [f"recall@{k}" for k in KS] + [f"hit@{k}" for k in KS] + ["mrr", "ndcg@10"]
    lines = [f"{'mode':<7} {'category':<12} {'n':>3} " + " ".join(f"{m:>9}" for m in metrics)]
    for mode, cats in report["results"].items():
        for cat in ["overall"] + sorted(c for c in cats if c != "overall"):
            row = cats[cat]
            lines.append(f"{mode:<7} {cat:<12} {row['n']:>3} " + " ".join(f"{row[m]:>9.3f}" for m in metrics))
    return "\n".join(lines)
