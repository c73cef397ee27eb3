"""The embedding model in a worker process: its answers, a failing batch, the worker's death, no orphan."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.retriever.adapters.embed_worker import EmbedderWorkerDied, EmbedderWorkerError, ProcessEmbedder
from services.retriever.adapters.embedders import HashEmbedder, open_embedder
from services.retriever.service_layer.batching import BatchingEmbedder

ROOT = Path(__file__).resolve().parents[2]


class Faulty(HashEmbedder):
    """Built in the worker: refuses any batch holding "poison"; "die" ends the worker's process outright."""

    def embed(self, texts: list[str]) -> list[list[float]]:
        if "die" in texts:
            os._exit(3)
        if any("poison" in t for t in texts):
            raise ValueError("cannot embed poison")
        return super().embed(texts)


class Unloadable:
    def __init__(self) -> None:
        raise OSError("weights not found")


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for its new parent to reap it: either way it runs nothing any more."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.fixture
def faulty():
    worker = ProcessEmbedder(f"{__name__}:Faulty", {"dim": 32})
    yield worker
    worker.close()


def test_the_worker_answers_what_the_model_answers_in_process() -> None:
    worker = open_embedder("hash", dim=64, runner="process")
    try:
        assert isinstance(worker, ProcessEmbedder) and worker.pid != os.getpid()
        assert (worker.name, worker.dim, worker.batch) == ("hash", 64, HashEmbedder.batch)
        texts = ["the flight to Lisbon", "去上海的机票", "", "the flight to Lisbon"]
        got, want = worker.embed(texts), HashEmbedder(64).embed(texts)
        assert len(got) == 4 and all(len(v) == 64 for v in got)
        assert got[0] == got[3] and got[0] != got[1]
        assert max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)) < 1e-6
        assert worker.embed([]) == []
        assert worker.model_seconds > 0
    finally:
        worker.close()


def test_a_batch_the_model_refuses_fails_alone_and_the_worker_serves_the_next(faulty: ProcessEmbedder) -> None:
    pid = faulty.pid
    with pytest.raises(EmbedderWorkerError, match="ValueError: cannot embed poison"):
        faulty.embed(["fine", "poison pill"])
    assert len(faulty.embed(["fine", "also fine"])) == 2
    assert faulty.pid == pid  # the same worker, still serving


async def test_through_the_batching_thread_only_the_failing_batch_callers_get_the_error(faulty) -> None:
    batching = BatchingEmbedder(faulty, max_batch=2)
    bad, good = await asyncio.gather(batching.embed(["poison", "fine"]), batching.embed(["later", "too"]),
                                     return_exceptions=True)
    assert isinstance(bad, EmbedderWorkerError) and len(good) == 2 and len(good[0]) == 32
    assert len(await batching.embed(["again"])) == 1


def test_a_worker_that_dies_fails_its_batch_and_the_next_call_starts_another(faulty: ProcessEmbedder) -> None:
    first = faulty.pid
    with pytest.raises(EmbedderWorkerDied):
        faulty.embed(["die"])
    assert _ended(first)
    assert len(faulty.embed(["after"])) == 1
    assert faulty.pid not in (None, first)
    os.kill(faulty.pid, signal.SIGKILL)  # killed from outside between two batches
    with pytest.raises(EmbedderWorkerDied):
        faulty.embed(["lost"])
    assert len(faulty.embed(["back again"])) == 1


def test_a_model_that_cannot_load_is_refused_at_start_with_the_reason() -> None:
    with pytest.raises(EmbedderWorkerError, match="OSError: weights not found"):
        ProcessEmbedder(f"{__name__}:Unloadable")
    with pytest.raises(ValueError, match="runner"):
        open_embedder("hash", runner="fork")


def test_close_stops_the_worker_and_is_idempotent() -> None:
    worker = ProcessEmbedder(f"{__name__}:Faulty", {"dim": 8})
    process = worker._process
    worker.close()
    assert process.returncode == 0  # it stopped on request, not killed
    assert worker.pid is None
    worker.close()


def test_no_orphan_when_the_parent_is_killed() -> None:
    """SIGKILL gives the parent no chance to stop its worker: the worker sees its pipe end and exits."""
    code = ("import sys, time\n"
            "from services.retriever.adapters.embed_worker import ProcessEmbedder\n"
            "w = ProcessEmbedder('services.retriever.adapters.embedders:HashEmbedder', {'dim': 8})\n"
            "w.embed(['warm'])\n"
            "print(w.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not _ended(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _ended(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(child), "the worker outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        parent.stdout.close()


async def test_batches_sent_ahead_come_back_in_order_whatever_their_size() -> None:
    """The batching thread sends the next batch before reading the running one's answer: with requests and
    answers larger than the pipe's buffer this must neither deadlock nor mix up answers."""
    worker = ProcessEmbedder("services.retriever.adapters.embedders:HashEmbedder", {"dim": 512})
    try:
        batching = BatchingEmbedder(worker, max_batch=256)
        requests = [[f"text {n} of request {r} " + "padding " * 600 for n in range(256)] for r in range(4)]
        answers = await asyncio.wait_for(asyncio.gather(*(batching.embed(t) for t in requests)), 60)
        model = HashEmbedder(512)
        for texts, vectors in zip(requests, answers, strict=True):
            assert len(vectors) == 256
            want = model.embed([texts[0], texts[-1]])
            assert max(abs(a - b) for a, b in zip(vectors[0], want[0], strict=True)) < 1e-6
            assert max(abs(a - b) for a, b in zip(vectors[-1], want[1], strict=True)) < 1e-6
    finally:
        worker.close()
