"""`mnemesh bench search`: the retriever's costs, each beside its floor, in one run.

- raw embedder throughput (the model alone, best batch size; measured before and after each load, the
  mean of both is the run's figure, as the shared machine's speed drifts) vs indexing throughput through the whole
  pipeline: the event's part as the stream consumer does it (batches of 256 memory.written recorded in
  PostgreSQL in one round under the memories' locks, NOTIFY) and the projectors' (two loops, as in the
  service: batches of recorded documents, redaction, segmentation, one embedding call, one Qdrant upsert,
  marked projected), until every memory is searchable; with how busy the model was during the load and its
  cost per text there beside its cost alone (a model left waiting and a model slowed down look different);
- raw engine hybrid query (dense + sparse, filters) vs the Search handler with the query vector given
  (fusion, PostgreSQL read-back, rescoring), and with the query embedded;
- read-after-write visibility: an event acknowledged by Redis (XADD) -> found by search, at `rate` writes/s,
  through the real bus consumer (own group, idempotent handler).
The memories are synthetic, half English and half Chinese, in one tenant.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from libs.bench import percentile
from libs.config import Settings
from libs.db import Database, apply_migrations, load_migrations

__all__ = ["bench_search"]

TENANT = "bench"
_EN = (["I", "My sister", "Our team", "The manager", "My friend Alex", "The landlord", "My doctor"],
       ["booked", "cancelled", "moved", "discussed", "paid for", "forgot about", "planned"],
       ["the flight to Lisbon", "the dentist appointment", "the quarterly report", "the kitchen renovation",
        "the piano lessons", "the car insurance", "the team offsite", "the birthday party", "the rent"],
       ["on Monday", "next week", "in March", "yesterday", "after the meeting", "before the holidays"])
_ZH = (["我", "我妈妈", "我们团队", "经理", "我的朋友小王", "房东", "医生"],
       ["预订了", "取消了", "推迟了", "讨论了", "支付了", "忘记了", "安排了"],
       ["去上海的机票", "牙医预约", "季度报告", "厨房装修", "钢琴课", "车险", "团队团建", "生日聚会", "房租"],
       ["在周一", "下周", "三月份", "昨天", "开会以后", "放假之前"])


def _texts(n: int, rng: random.Random) -> list[str]:
    out = []
    for i in range(n):
        parts = _ZH if i % 2 else _EN
        words = [rng.choice(p) for p in parts]
        out.append(("".join(words) + f"，编号{i}。") if i % 2 else (" ".join(words) + f", ref {i}."))
    return out




def _stats(samples: list[float]) -> dict:
    return {"p50_ms": round(statistics.median(samples), 3), "p95_ms": round(percentile(samples, 0.95), 3),
            "p99_ms": round(percentile(samples, 0.99), 3), "samples": len(samples)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _Timed:
    """The embedder, timing its calls: how busy the model was during a load, and its cost per text there
    (beside the raw figure, it tells a model slowed down by its neighbours from a model left waiting)."""

    def __init__(self, embedder) -> None:
        self.embedder, self.name, self.dim, self.batch = embedder, embedder.name, embedder.dim, embedder.batch
        self.seconds, self.texts = 0.0, 0

    def embed(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        try:
            return self.embedder.embed(texts)
        finally:
            self.seconds += time.perf_counter() - started
            self.texts += len(texts)


RECORD_BATCH = 256  # memory.written per stream read, as the service's consumer (bootstrap.EVENT_BATCH)
PROJECTORS = 2  # as the service (bootstrap.PROJECTORS)


async def bench_search(settings: Settings, repetitions: int, warmup: int, memories: str = "10000,100000",
                       rate: float = 50.0, writes: int = 200) -> dict:
    from services.retriever.adapters.embedders import open_embedder
    from services.retriever.adapters.postgres import PostgresDocuments
    from services.retriever.adapters.vectors import EdgeVectorIndex, IndexQuery
    from services.retriever.domain import Bm25, Document, SearchQuery
    from services.retriever.service_layer.batching import BatchingEmbedder
    from libs.db.notify import Notifier
    from services.retriever.service_layer.handlers import Retrieval, record_documents, search
    from services.retriever.service_layer.projector import Projector

    sizes = [int(s) for s in str(memories).split(",")]
    rng = random.Random(1)
    embedder = await asyncio.to_thread(open_embedder, settings.embedder, threads=settings.embedder_threads)
    sample = _texts(1024, rng)
    await asyncio.to_thread(embedder.embed, sample[:256])  # warm-up: allocations, caches
    raw = {}
    for batch in (16, 32, 64, 128):
        started = time.perf_counter()
        for i in range(0, len(sample), batch):
            await asyncio.to_thread(embedder.embed, sample[i:i + batch])
        raw[batch] = len(sample) / (time.perf_counter() - started)
    best_batch = max(raw, key=raw.get)
    raw_before = raw[best_batch]

    async def raw_rate(batch: int) -> float:
        started = time.perf_counter()
        for i in range(0, len(sample), batch):
            await asyncio.to_thread(embedder.embed, sample[i:i + batch])
        return len(sample) / (time.perf_counter() - started)

    _say(f"raw embedder ({embedder.name}): " + ", ".join(f"batch {b}: {v:.0f}/s" for b, v in raw.items()))

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    await apply_migrations(settings.database_url, schema, load_migrations() + load_migrations("services.retriever"))
    db = Database(settings.database_url, schema, max_size=8)
    await db.open()
    tmp = tempfile.TemporaryDirectory(prefix="mnemesh-bench-")
    index = EdgeVectorIndex(Path(tmp.name) / "memories", dim=embedder.dim, hnsw_m=settings.hnsw_m,
                            hnsw_ef_construct=settings.hnsw_ef_construct)
    # The pipeline's model: this one (runner "thread"), or a second copy in a worker process (runner
    # "process", MNEMESH_EMBEDDER_RUNNER); the raw figure is always this process's model called directly.
    runner = settings.embedder_runner
    worker = None
    if runner == "process":
        worker = await asyncio.to_thread(open_embedder, settings.embedder, threads=settings.embedder_threads,
                                         runner="process")
    timed = _Timed(worker or embedder)
    _say(f"pipeline model: {runner} runner, {settings.embedder_threads or 'up to 4'} thread(s) per forward pass")
    retrieval = Retrieval(index, BatchingEmbedder(timed, max_batch=best_batch), Bm25(avg_len=settings.bm25_avg_len))
    await asyncio.to_thread(retrieval.bm25.load)  # as the service does at start-up
    store = PostgresDocuments(db)
    notifier = Notifier(db.connect, PostgresDocuments.channel(db))
    now = datetime.now(UTC)
    runs = []
    loaded = 0
    try:
        for size in sizes:
            texts = _texts(size - loaded, random.Random(size))
            docs = [Document(memory_id=str(uuid.uuid4()), tenant_id=TENANT, user_id=f"u{i % 50}", session_id="s",
                             layer=5, source=2, confidence=1 + i % 3, content=t, terms=(), tags=(),
                             created_at=now - timedelta(minutes=i), expires_at=None) for i, t in enumerate(texts)]
            projectors = [Projector(store, retrieval, notifier.mark, notifier.wait) for _ in range(PROJECTORS)]
            timed.seconds, timed.texts = 0.0, 0
            worker_seconds = worker.model_seconds if worker is not None else 0.0
            started = time.perf_counter()
            running = [asyncio.create_task(p.run()) for p in projectors]  # as in the service: woken by commits
            for i in range(0, len(docs), RECORD_BATCH):
                await record_documents([(d, 0) for d in docs[i:i + RECORD_BATCH]], store)
                if (i // RECORD_BATCH) % 40 == 39:
                    _say(f"  recorded {loaded + i + RECORD_BATCH}/{size}, projected "
                         f"{loaded + sum(p.projected for p in projectors)}")
            said = time.perf_counter()
            while sum(p.projected for p in projectors) < len(docs):
                await asyncio.sleep(0.5)  # a benchmark polls its own progress; tests never do
                if time.perf_counter() - said > 30:
                    said = time.perf_counter()
                    _say(f"  projected {loaded + sum(p.projected for p in projectors)}/{size}")
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            load_s = time.perf_counter() - started
            index_rate = len(docs) / load_s
            # in a worker process, the model's own time (the calls' time less the pipe's)
            model_s = worker.model_seconds - worker_seconds if worker is not None else timed.seconds
            model_busy, model_ms = model_s / load_s, 1000 * model_s / max(timed.texts, 1)
            # The model alone again, right after the load: on a shared machine its speed drifts, so the
            # pipeline is compared with the mean of the model's speed just before and just after it.
            raw_after = await raw_rate(best_batch)
            raw_window = (raw_before + raw_after) / 2
            raw_before = raw_after
            loaded = size
            started = time.perf_counter()
            await asyncio.to_thread(index.optimize)  # what the service's optimizer task does every 30 s
            optimize_s = time.perf_counter() - started

            queries = [t.split(",")[0].split("，")[0] for t in _texts(64, random.Random(7))]
            vectors = await asyncio.to_thread(embedder.embed, queries)
            bm25 = retrieval.bm25
            engine, handler, embedded = [], [], []
            for i in range(warmup + repetitions):
                n = i % len(queries)
                q = SearchQuery(TENANT, "", queries[n], limit=10, mode="hybrid").validated()
                t0 = time.perf_counter()
                await asyncio.to_thread(index.query, IndexQuery(q, vectors[n], bm25.query(queries[n]), now, q.candidates))
                t1 = time.perf_counter()
                await search(q, store, retrieval, dense=vectors[n])
                t2 = time.perf_counter()
                await search(q, store, retrieval)
                t3 = time.perf_counter()
                if i >= warmup:
                    engine.append((t1 - t0) * 1000)
                    handler.append((t2 - t1) * 1000)
                    embedded.append((t3 - t2) * 1000)
            runs.append({"memories": size, "index_texts_per_s": round(index_rate, 1), "optimize_s": round(optimize_s, 1),
                         "raw_embed_texts_per_s": round(raw_window, 1),
                         "index_ratio": round(index_rate / raw_window, 3),
                         "runner": runner, "model_busy": round(model_busy, 3), "model_ms_per_text_in_load": round(model_ms, 3),
                         "raw_ms_per_text": round(1000 / raw_window, 3),
                         "raw_engine": _stats(engine), "search": _stats(handler),
                         "search_with_embedding": _stats(embedded)})
            _say(f"{size} memories: raw embedder {raw_window:.0f}/s, index {index_rate:.0f}/s (ratio "
                 f"{index_rate / raw_window:.2f}; the model busy {model_busy:.0%} of the load, {model_ms:.2f} ms/text there, "
                 f"{1000 / raw_window:.2f} alone), optimize {optimize_s:.1f} s, engine p95 {percentile(engine, .95):.2f} ms, search p95 "
                 f"{percentile(handler, .95):.2f} ms, with embedding p95 {percentile(embedded, .95):.2f} ms")
        visibility = await _visibility(settings, db, retrieval, rate, writes, notifier)
        _say(f"visibility at {rate:.0f} writes/s: p50 {visibility['p50_ms']} ms, p95 {visibility['p95_ms']} ms")
    finally:
        if worker is not None:
            await asyncio.to_thread(worker.close)
        await notifier.close()
        await asyncio.to_thread(index.close)
        tmp.cleanup()
        await db.close()
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()
    last = runs[-1]
    summary = {
        "raw_embed_texts_per_s": last["raw_embed_texts_per_s"],
        "index_texts_per_s": last["index_texts_per_s"],
        "index_ratio": last["index_ratio"],
        "raw_engine_p95_ms": last["raw_engine"]["p95_ms"],
        "search_p95_ms": last["search"]["p95_ms"],
        "search_p95_ratio": round(last["search"]["p95_ms"] / last["raw_engine"]["p95_ms"], 3),
        "search_with_embedding_p95_ms": last["search_with_embedding"]["p95_ms"],
        "visibility_p95_ms": visibility["p95_ms"],
        "memories": last["memories"],
    }
    return {"results": [{"raw_embed": {str(b): round(v, 1) for b, v in raw.items()}, "embedder": embedder.name,
                         "runs": runs, "visibility": visibility}], "summary": summary}


async def _visibility(settings: Settings, db: Database, retrieval, rate: float, writes: int, notifier) -> dict:
    """Publish memory.written events at `rate`/s; time XADD acknowledged -> the memory found by search. The
    events go through the service's own consumer (BatchConsumer, batch handler) and projectors."""
    from libs.events import Envelope
    from libs.events.batches import BatchConsumer
    from libs.events.bus import EventBus
    from libs.events.schema import MEMORY_EVENTS
    from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
    from services.retriever.adapters.postgres import PostgresDocuments
    from services.retriever.domain import SearchQuery
    from services.retriever.entrypoints.streams import on_memory_batch
    from services.retriever.service_layer.handlers import search
    from services.retriever.service_layer.projector import Projector

    namespace = f"bench{uuid.uuid4().hex[:6]}"
    bus = EventBus(settings.redis_url, consumer_name="bench", namespace=namespace)
    consumer = BatchConsumer(bus, db, MEMORY_EVENTS, "retriever",
                             on_memory_batch(lambda conn: PostgresDocuments(db, conn), retrieval), None,
                             batch_size=RECORD_BATCH, block_ms=200)
    store = PostgresDocuments(db)
    tasks = [asyncio.create_task(consumer.run())]
    tasks += [asyncio.create_task(Projector(store, retrieval, notifier.mark, notifier.wait).run())
              for _ in range(PROJECTORS)]
    samples: list[float] = []
    pending: dict[str, float] = {}  # token -> when its XADD was acknowledged
    done = asyncio.Event()

    async def check() -> None:
        """One search per round for the (up to 50) oldest pending tokens, each a unique word: a hit names the
        token it contains. One poller per write would queue hundreds of searches ahead of the projectors'
        work and measure that queue instead."""
        while not (done.is_set() and not pending):
            tokens = list(pending)[:50]
            if tokens:
                query = SearchQuery(TENANT, "visibility", " ".join(tokens), limit=len(tokens), mode="sparse")
                seen = time.perf_counter()
                for hit in await search(query, store, retrieval):
                    token = hit.document.content.split()[2]
                    if token in pending:
                        samples.append((seen - pending.pop(token)) * 1000)
            await asyncio.sleep(0.002)  # a benchmark polls; tests never do

    await consumer.ready.wait()
    checker = asyncio.create_task(check())
    try:
        for i in range(writes):
            # letters only: a run of 9+ digits would be redacted as a possible card or phone number
            token = "vis" + "".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))
            memory = common_pb2.Memory(memory_id=str(uuid.uuid4()), layer=5, source=2, confidence=1,
                                       tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id="visibility"),
                                       content=f"visibility probe {token} number {i}")
            memory.created_at.GetCurrentTime()
            envelope = Envelope.wrap(events_pb2.MemoryWritten(memory=memory), event_type="memory.written",
                                     tenant_id=TENANT)
            await bus.publish(envelope)
            pending[token] = time.perf_counter()
            await asyncio.sleep(1 / rate)
        done.set()
        try:
            await asyncio.wait_for(asyncio.shield(checker), timeout=120)
        except TimeoutError:
            pass  # reported below as not visible: the consumer could not keep up at this rate
    finally:
        checker.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(checker, *tasks, return_exceptions=True)
        redis = await bus.redis()
        await redis.delete(bus.stream_name(MEMORY_EVENTS))
        await bus.stop()
    if not samples:
        return {"rate_per_s": rate, "p50_ms": None, "p95_ms": None, "p99_ms": None, "samples": 0,
                "not_visible_after_120s": len(pending)}
    return {"rate_per_s": rate, **_stats(samples), "not_visible_after_120s": len(pending)}
