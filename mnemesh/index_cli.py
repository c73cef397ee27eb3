"""`mnemesh index rebuild`: ask the running retriever to rebuild its vector index, with a progress bar."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import grpc

from libs.config import Settings
from libs.progress import progress_bar
from libs.protogen.mnemesh.v1 import memory_pb2, memory_pb2_grpc

__all__ = ["add_index_commands"]


def index_rebuild(settings: Settings, ns: argparse.Namespace, run) -> int:
    async def call(ch: grpc.aio.Channel) -> None:
        last = None
        async for progress in memory_pb2_grpc.RetrieverStub(ch).RebuildIndex(
                memory_pb2.RebuildIndexRequest(batch=ns.batch)):
            if progress.phase == "copying":
                progress_bar("rebuild", progress.done, max(progress.total, 1) if progress.total else 1)
            last = progress
        if last is not None:
            print(json.dumps({"phase": last.phase, "memories": last.done, "index": last.index}))

    return run(settings, ns, "retriever", call)


def add_index_commands(sub: argparse._SubParsersAction, settings_of: Callable[[], Settings]) -> None:
    from mnemesh.client_cli import _run

    index = sub.add_parser("index", help="the retriever's vector index").add_subparsers(dest="verb", required=True)
    p = index.add_parser("rebuild", help="replay the memory projection into a fresh index, then swap it in "
                                         "(searches keep working throughout; needs memory:admin)")
    p.add_argument("--batch", type=int, default=0, help="memories embedded and written together (default 256)")
    p.add_argument("--tenant", default="default", help="tenant of the minted token (default: default)")
    p.add_argument("--user", default="dev", help="subject of the minted token (default: dev)")
    p.set_defaults(func=lambda ns: index_rebuild(settings_of(), ns, _run))
