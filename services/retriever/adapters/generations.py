"""Generations of the vector index, and the switch that swaps a rebuilt one in with no search outage.

A rebuild fills a fresh generation while the current one keeps serving. Meanwhile the switch writes
every change (upsert, payload, delete) to both, so nothing written during the copy is missing from the
new one. The swap is one pointer change in the process, then made durable for the next start:
- the embedded engine: a pointer file naming the current shard directory, replaced atomically
  (os.replace); the old shard is closed once no call uses it any more, then removed;
- a Qdrant server: the alias `memories` moved to the new collection in one alias update (atomic on the
  server, so every replica querying through the alias switches at once); the old collection is dropped.
Every method blocks: callers run them off the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from services.retriever.adapters.vectors import COLLECTION, EdgeVectorIndex, ServerVectorIndex, client_guard

__all__ = ["EdgeGenerations", "RebuildRunning", "ServerGenerations", "SwitchableIndex"]

log = logging.getLogger("mnemesh.retriever.generations")


class RebuildRunning(RuntimeError):
    """A second rebuild while one is under way."""


def _stamp() -> str:
    return time.strftime("%Y%m%d%H%M%S") + f"{time.time_ns() % 1_000_000_000:09d}"


class EdgeGenerations:
    """Shard directories under `base`; `<collection>-<dim>.current` names the one in service."""

    def __init__(self, base: Path, *, dim: int, hnsw_m: int = 16, hnsw_ef_construct: int = 100) -> None:
        self.base, self.dim = base, dim
        self.hnsw = {"dim": dim, "hnsw_m": hnsw_m, "hnsw_ef_construct": hnsw_ef_construct}
        self.pointer = base / f"{COLLECTION}-{dim}.current"

    def open(self) -> EdgeVectorIndex:
        name = self.pointer.read_text().strip() if self.pointer.exists() else f"{COLLECTION}-{self.dim}"
        index = EdgeVectorIndex(self.base / name, **self.hnsw)
        index.name = name
        return index

    def fresh(self) -> EdgeVectorIndex:
        name = f"{COLLECTION}-{self.dim}-{_stamp()}"
        index = EdgeVectorIndex(self.base / name, **self.hnsw)
        index.name = name
        return index

    def promote(self, fresh: EdgeVectorIndex, old: EdgeVectorIndex) -> None:
        fresh.shard.flush()
        tmp = self.pointer.with_suffix(".tmp")
        tmp.write_text(fresh.name)
        os.replace(tmp, self.pointer)  # atomic: a crash leaves either the old pointer or the new one

    def retire(self, old: EdgeVectorIndex) -> None:
        old.close()
        shutil.rmtree(self.base / old.name, ignore_errors=True)

    def discard(self, fresh: EdgeVectorIndex) -> None:
        self.retire(fresh)


class ServerGenerations:
    """Collections `memories_<stamp>` behind the alias `memories`. A collection named `memories` made by an
    older version is served as it is until the first rebuild replaces it with the alias."""

    def __init__(self, url: str, *, dim: int, hnsw_m: int = 16, hnsw_ef_construct: int = 100, client=None,
                 alias: str = COLLECTION) -> None:
        from qdrant_client import QdrantClient, models

        self._m, self.url, self.alias, self._guard = models, url, alias, client_guard(url)
        self.hnsw = {"dim": dim, "hnsw_m": hnsw_m, "hnsw_ef_construct": hnsw_ef_construct}
        self.client = client or (QdrantClient(location=url) if url == ":memory:" else QdrantClient(url=url))

    def _target(self) -> str | None:
        """The collection the alias names (None: no alias)."""
        for a in self.client.get_aliases().aliases:
            if a.alias_name == self.alias:
                return a.collection_name
        return None

    def open(self) -> ServerVectorIndex:
        with self._guard:
            return self._open()

    def _open(self) -> ServerVectorIndex:
        if self._target() is None and not self.client.collection_exists(self.alias):
            first = ServerVectorIndex(self.url, collection=f"{self.alias}_{_stamp()}", client=self.client, **self.hnsw)
            self._move_alias(first.collection)
        index = ServerVectorIndex(self.url, collection=self.alias, client=self.client, **self.hnsw)
        index.name = self._target() or self.alias
        return index

    def fresh(self) -> ServerVectorIndex:
        with self._guard:
            index = ServerVectorIndex(self.url, collection=f"{self.alias}_{_stamp()}", client=self.client, **self.hnsw)
        index.name = index.collection
        return index

    def _move_alias(self, collection: str) -> None:
        m = self._m
        ops = [m.CreateAliasOperation(create_alias=m.CreateAlias(collection_name=collection, alias_name=self.alias))]
        if self._target() is not None:
            ops.insert(0, m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=self.alias)))
        self.client.update_collection_aliases(ops)  # one request: the server applies it atomically

    def promote(self, fresh: ServerVectorIndex, old: ServerVectorIndex) -> None:
        with self._guard:
            self._promote(fresh)

    def _promote(self, fresh: ServerVectorIndex) -> None:
        if self._target() is None and self.client.collection_exists(self.alias):
            # A collection of an older version holds the alias's name: it must go before the alias can exist.
            # This process already serves from `fresh`; other replicas see a short gap here, once.
            self.client.delete_collection(self.alias)
        self._move_alias(fresh.collection)
        fresh.collection = self.alias  # from now on through the alias, as every replica

    def retire(self, old: ServerVectorIndex) -> None:
        with self._guard:
            if old.name != self.alias and self.client.collection_exists(old.name) and old.name != self._target():
                self.client.delete_collection(old.name)
        old.close()

    def discard(self, fresh: ServerVectorIndex) -> None:
        with self._guard:
            if fresh.collection != self.alias:
                self.client.delete_collection(fresh.collection)
        fresh.close()


class SwitchableIndex:
    """The VectorIndex the service uses: reads from the current generation, writes to it and, during a
    rebuild, to the fresh one too. A generation is closed only after the last call using it returns."""

    def __init__(self, generations) -> None:
        self.generations = generations
        self.current = generations.open()
        self.fresh = None
        self._lock = threading.Condition()
        self._users: dict[int, int] = {}  # id(index) -> calls in flight

    @property
    def name(self) -> str:
        return self.current.name

    @property
    def dirty(self) -> bool:
        return bool(getattr(self.current, "dirty", False) or getattr(self.fresh, "dirty", False))

    @contextlib.contextmanager
    def _using(self, *, writes: bool = False) -> Iterator[list]:
        with self._lock:
            targets = [self.current] + ([self.fresh] if writes and self.fresh is not None else [])
            for t in targets:
                self._users[id(t)] = self._users.get(id(t), 0) + 1
        try:
            yield targets
        finally:
            with self._lock:
                for t in targets:
                    self._users[id(t)] -= 1
                self._lock.notify_all()

    # --- the VectorIndex port ---------------------------------------------------------------------------------
    def upsert(self, documents) -> None:
        with self._using(writes=True) as targets:
            for t in targets:
                t.upsert(documents)

    def set_payloads(self, tenant_id: str, documents) -> None:
        with self._using(writes=True) as targets:
            for t in targets:
                t.set_payloads(tenant_id, documents)

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        with self._using(writes=True) as targets:
            for t in targets:
                t.delete(tenant_id, memory_ids)

    def query(self, iq):
        with self._using() as (index,):
            return index.query(iq)

    def retrieve(self, tenant_id: str, memory_ids: list[str]) -> dict[str, dict]:
        with self._using() as (index,):
            return index.retrieve(tenant_id, memory_ids)

    def count(self, tenant_id: str | None = None) -> int:
        with self._using() as (index,):
            return index.count(tenant_id)

    def optimize(self) -> bool:
        with self._using() as (index,):
            return index.optimize()

    def close(self) -> None:
        with self._lock:
            if self.fresh is not None:
                self.generations.discard(self.fresh)
                self.fresh = None
            self.current.close()

    # --- rebuilds ---------------------------------------------------------------------------------------------
    def prepare(self):
        """A fresh, empty generation; from now on every write goes to it as well. Returns it (to fill)."""
        with self._lock:
            if self.fresh is not None:
                raise RebuildRunning("a rebuild of this index is under way")
            self.fresh = self.generations.fresh()
            return self.fresh

    def commit(self) -> str:
        """Swap the filled generation in (searches move to it at once), make that durable, and retire the
        old one when its last call returns. Returns the new generation's name."""
        with self._lock:
            old, fresh = self.current, self.fresh
            self.generations.promote(fresh, old)
            self.current, self.fresh = fresh, None
            while self._users.get(id(old), 0):
                self._lock.wait()
            self._users.pop(id(old), None)
        self.generations.retire(old)
        log.info("vector index swapped", extra={"index": fresh.name, "retired": old.name})
        return fresh.name

    def abort(self) -> None:
        with self._lock:
            fresh, self.fresh = self.fresh, None
            while fresh is not None and self._users.get(id(fresh), 0):
                self._lock.wait()
        if fresh is not None:
            self.generations.discard(fresh)
