"""`mnemesh eval retrieval --dataset FILE`: boots the retriever's index path in process (real embedder,
real Qdrant engine: the embedded one in a temporary folder, or QDRANT_URL / --qdrant-url) and reports."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

__all__ = ["add_eval_commands"]


async def _run(ns: argparse.Namespace) -> dict:
    from services.retriever.adapters.embedders import open_embedder
    from services.retriever.adapters.memory import InMemoryDocuments
    from services.retriever.adapters.vectors import EdgeVectorIndex, ServerVectorIndex
    from services.retriever.domain import Bm25
    from services.retriever.evaluation.harness import evaluate, load_dataset
    from services.retriever.service_layer.batching import BatchingEmbedder
    from services.retriever.service_layer.handlers import Retrieval

    dataset = load_dataset(ns.dataset)
    started = time.perf_counter()
    embedder = await asyncio.to_thread(open_embedder, ns.embedder)
    with tempfile.TemporaryDirectory(prefix="mnemesh-eval-") as tmp:
        if ns.qdrant_url:
            index = ServerVectorIndex(ns.qdrant_url, dim=embedder.dim, collection=f"eval_{int(time.time())}")
        else:
            index = EdgeVectorIndex(Path(tmp) / "memories", dim=embedder.dim)
        try:
            retrieval = Retrieval(index, BatchingEmbedder(embedder), Bm25(segmenter=ns.segmenter))
            report = await evaluate(dataset, InMemoryDocuments(), retrieval, modes=tuple(ns.modes.split(",")),
                                    fusion=ns.fusion)
        finally:
            if ns.qdrant_url:
                index.client.delete_collection(index.collection)
            index.close()
    return {"dataset": str(ns.dataset), "embedder": embedder.name, "segmenter": ns.segmenter,
            "seconds": round(time.perf_counter() - started, 1), **report}


def cmd_eval_retrieval(ns: argparse.Namespace) -> int:
    from services.retriever.evaluation.harness import format_table

    report = asyncio.run(_run(ns))
    print(format_table(report))
    print(json.dumps(report, ensure_ascii=False))
    return 0


def add_eval_commands(sub: argparse._SubParsersAction) -> None:
    from services.retriever.evaluation.harness import DATASET

    evals = sub.add_parser("eval", help="measure retrieval quality").add_subparsers(dest="what", required=True)
    p = evals.add_parser("retrieval", help="recall@k, hit@k, MRR, nDCG@10 per mode on a conversational dataset")
    p.add_argument("--dataset", type=Path, default=DATASET, help="JSON in the documented format (default: shipped)")
    p.add_argument("--embedder", default="use-multilingual", help="use-multilingual, minilm or hash")
    p.add_argument("--segmenter", default="jieba", choices=["jieba", "bigram"])
    p.add_argument("--fusion", default="", help="rrf or score (default: the search default)")
    p.add_argument("--modes", default="dense,sparse,hybrid,full")
    p.add_argument("--qdrant-url", help="a Qdrant server (default: the embedded engine in a temporary folder)")
    p.set_defaults(func=cmd_eval_retrieval)
