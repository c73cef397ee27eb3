"""The embedding model in a worker process of its own (`MNEMESH_EMBEDDER_RUNNER=process`).

On two cores the model and the rest of the pipeline (segmentation, the index upsert, the PostgreSQL
client) compete for one interpreter lock when the model runs on a thread; in a child process the model's
tokenizer and forward pass run beside the pipeline instead of taking turns with it.

- Started once per service process (a fresh interpreter: no copy of the parent's threads, loop or
  sockets), the model loaded there once; `ProcessEmbedder.embed` is the same blocking call as a model's
  (the batching thread makes it), so it drops in where the model was.
- The wire: one duplex pipe. A request is the batch's texts as UTF-8 JSON; the answer is a status byte, the
  seconds the model took (float64), then the vectors as raw float32 (`rows × dim`), read back with
  `numpy.frombuffer`: nothing is pickled, no Python float list crosses the pipe.
- A batch that fails in the model fails its callers alone: the child answers with the error's text and
  serves the next batch. A child that died (killed, out of memory) fails the batch in flight with
  `EmbedderWorkerDied`, and the next call starts a new one.
- No orphan: the child blocks on the pipe, and the pipe ends when the parent does (even SIGKILLed): the
  child reads end-of-file and exits. `close()` asks it to stop, waits, and terminates it if it does not.
"""

from __future__ import annotations

import json
from collections import deque
import logging
import multiprocessing
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from importlib import import_module
from multiprocessing.connection import Connection

import numpy as np

__all__ = ["EmbedderWorkerDied", "EmbedderWorkerError", "ProcessEmbedder"]

log = logging.getLogger("mnemesh.retriever.embedder")

_OK, _FAILED = b"\x00", b"\x01"
_HEADER = struct.Struct("<d")  # the seconds the model took for the batch
_START_TIMEOUT = 120.0  # loading a local model takes seconds; this bounds a child that hangs at start


class EmbedderWorkerError(RuntimeError):
    """The model failed on this batch in the worker process (the message is the worker's error)."""


class EmbedderWorkerDied(RuntimeError):
    """The worker process ended while a batch was in flight; the next call starts a new one."""


def _serve(conn, factory: str, kwargs: dict) -> None:
    """The child: load the model, then answer batches until the parent closes the pipe (or dies)."""
    module, _, name = factory.partition(":")
    try:
        model = getattr(import_module(module), name)(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it at start
        conn.send_bytes(_FAILED + f"{type(exc).__name__}: {exc}".encode())
        return
    conn.send_bytes(_OK + json.dumps({"name": model.name, "dim": model.dim, "batch": model.batch}).encode())
    # A reader thread drains the requests while the model runs, so a parent sending its next batch
    # never blocks on a full pipe while this process blocks sending an answer (no deadlock, any sizes).
    requests: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                request = conn.recv_bytes()
            except (EOFError, OSError):  # the parent closed its end or died: nobody waits for vectors
                request = b""
            requests.put(request)
            if not request:
                return

    threading.Thread(target=read, name="requests", daemon=True).start()
    while request := requests.get():  # empty: an orderly stop, or the parent is gone
        started = time.perf_counter()
        try:
            vectors = np.ascontiguousarray(model.embed(json.loads(request)), dtype=np.float32)
            answer = b"".join((_OK, _HEADER.pack(time.perf_counter() - started), vectors.tobytes()))
        except Exception as exc:  # noqa: BLE001 - this batch's callers get it; the next batch is served
            answer = _FAILED + f"{type(exc).__name__}: {exc}".encode()
        try:
            conn.send_bytes(answer)
        except (BrokenPipeError, OSError):
            return


def _stop(process: subprocess.Popen, timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _main() -> None:
    """The child's entry: argv is the pipe's descriptor, the model factory, its keyword arguments (JSON)."""
    fd, factory, kwargs = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the parent stops us
    _serve(Connection(fd), factory, kwargs)


class ProcessEmbedder:
    """An embedder whose model runs in a child process; `embed` blocks (call it off the event loop).

    `factory` is "module:callable" returning the model (an object with name, dim, batch, embed), built in
    the child with `kwargs`. The model runs one batch at a time; batches are answered in the order sent.
    `submit`/`collect` are for one thread (the batching thread, which keeps one batch queued behind the one
    running); `embed` (both at once) from any thread, but not while that thread has batches in flight: an
    answer goes to whoever collects next."""

    def __init__(self, factory: str, kwargs: dict | None = None) -> None:
        self.factory, self.kwargs = factory, dict(kwargs or {})
        self.model_seconds = 0.0  # the model's own time over every batch (without the pipe)
        self._lock = threading.Lock()  # the pipe and the batches in flight
        self._calls = threading.Lock()  # one embed() at a time (submit then collect)
        self._inflight: deque[tuple[int, int]] = deque()  # (worker generation, texts) per batch sent
        self._generation = 0
        self._process = None
        self._conn = None
        self._start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> None:
        parent, child = multiprocessing.Pipe(duplex=True)
        # A fresh interpreter running only the worker (not multiprocessing's spawn, which imports the
        # parent's __main__ again); it gets the child's end of the pipe and nothing else.
        paths = [p or os.getcwd() for p in sys.path]
        code = (f"import sys; sys.path[:0] = {paths!r}; "
                "from services.retriever.adapters.embed_worker import _main; _main()")
        process = subprocess.Popen([sys.executable, "-c", code, str(child.fileno()), self.factory,
                                    json.dumps(self.kwargs)], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()  # the child's end lives only in the child: its death is our EOF, ours is its
        try:
            ready = parent.poll(_START_TIMEOUT)
            hello = parent.recv_bytes() if ready else None
        except EOFError:
            hello = b""
        if not hello or hello[:1] != _OK:
            parent.close()
            if hello is None or process.poll() is None:
                process.kill()
            process.wait(5)
            if hello is None:
                raise EmbedderWorkerDied(f"the embedder worker ({self.factory}) did not start in {_START_TIMEOUT:.0f} s")
            if not hello:
                raise EmbedderWorkerDied(f"the embedder worker ({self.factory}) exited at start "
                                         f"(exit code {process.returncode})")
            raise EmbedderWorkerError(f"the embedder worker could not load {self.factory}: {hello[1:].decode()}")
        about = json.loads(hello[1:])
        self.name, self.dim, self.batch = about["name"], about["dim"], about["batch"]
        self._process, self._conn = process, parent
        log.info("embedder worker started", extra={"pid": process.pid, "embedder": self.name})

    def embed(self, texts: list[str]) -> list[list[float]]:
        """The texts' vectors (float32 values; lists, what the engine builds its points from fastest: measured
        with qdrant-edge 0.9, a point from a list of floats in 8 µs, from a float32 array row in 27). Raises
        EmbedderWorkerError (the model refused this batch) or EmbedderWorkerDied (the worker ended
        meanwhile; the next call starts a new one)."""
        if not texts:
            return []
        with self._calls:
            self.submit(texts)
            return self.collect()

    def submit(self, texts: list[str]) -> None:
        """Send a batch; its answer is read by `collect`, answers in the order sent. The batching thread
        sends the next batch before collecting the running one, so the model never waits for it."""
        with self._lock:
            if self._conn is None:
                self._start()
            try:
                self._conn.send_bytes(json.dumps(list(texts), ensure_ascii=False).encode())
            except OSError as exc:
                self._discard()
                raise EmbedderWorkerDied(f"the embedder worker ended before a batch of {len(texts)} texts: "
                                         f"{type(exc).__name__}") from None
            self._inflight.append((self._generation, len(texts)))

    def collect(self) -> list[list[float]]:
        """The vectors of the oldest batch sent and not collected yet."""
        with self._lock:
            generation, n = self._inflight.popleft()
            if generation != self._generation:
                raise EmbedderWorkerDied(f"the embedder worker ended with a batch of {n} texts in flight")
            try:
                answer = self._conn.recv_bytes()
            except (EOFError, OSError) as exc:
                self._discard()
                raise EmbedderWorkerDied(f"the embedder worker ended during a batch of {n} texts: "
                                         f"{type(exc).__name__}") from None
        if answer[:1] != _OK:
            raise EmbedderWorkerError(answer[1:].decode(errors="replace"))
        (seconds,) = _HEADER.unpack_from(answer, 1)
        self.model_seconds += seconds
        vectors = np.frombuffer(answer, dtype=np.float32, offset=1 + _HEADER.size)
        if vectors.size != n * self.dim:
            raise EmbedderWorkerError(f"the embedder worker returned {vectors.size} floats for {n} "
                                      f"texts of {self.dim} dimensions")
        return vectors.reshape(n, self.dim).tolist()

    def _discard(self) -> None:
        """Forget a dead worker (reaped), so that the next call starts another; the batches in flight fail."""
        self._generation += 1
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            _stop(self._process, 1.0)
        self._process = self._conn = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker: ask it, wait up to `timeout` (it finishes a batch in flight first), then kill it."""
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.send_bytes(b"")
            except OSError:
                pass
            self._conn.close()
            _stop(self._process, timeout)
            self._process = self._conn = None

    def __del__(self) -> None:  # a forgotten embedder does not leave its process behind
        try:
            if self._conn is not None:
                self.close(timeout=1.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
