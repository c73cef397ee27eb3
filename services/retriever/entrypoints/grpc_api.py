"""gRPC Retriever: translate only."""

from __future__ import annotations

from libs.protogen.mnemesh.v1 import memory_pb2, memory_pb2_grpc
from libs.rpc import Registration
from services.retriever.adapters.mapping import (
    condition_to_proto,
    hit_to_proto,
    memory_to_proto,
    query_from_proto,
    structured_query_from_proto,
)
from services.retriever.service_layer import handlers
from services.retriever.service_layer.ports import DocumentStore, StructuredStore
from services.retriever.service_layer.structured import Vocabularies, query_memories, routed_search

__all__ = ["registration"]

SCOPES = {"Search": "memory:read", "Query": "memory:read", "RebuildIndex": "memory:admin"}


class RetrieverServicer(memory_pb2_grpc.RetrieverServicer):
    def __init__(self, store: DocumentStore, queries: StructuredStore, retrieval: handlers.Retrieval,
                 rebuild=None) -> None:
        self.store, self.queries, self.retrieval, self.rebuild = store, queries, retrieval, rebuild
        self.vocabularies = Vocabularies()

    async def Search(self, request, context):
        # The auth interceptor refuses a request whose tenant is not the token's, so the request's
        # tenant is the caller's here.
        routed = await routed_search(query_from_proto(request), self.store, self.queries, self.retrieval,
                                     self.vocabularies)
        return memory_pb2.SearchResponse(hits=[hit_to_proto(h) for h in routed.hits], route=routed.route,
                                         conditions=[condition_to_proto(c) for c in routed.conditions])

    async def Query(self, request, context):
        memories, truncated = await query_memories(structured_query_from_proto(request), self.queries)
        return memory_pb2.QueryResponse(memories=[memory_to_proto(d) for d in memories], truncated=truncated)

    async def RebuildIndex(self, request, context):
        if self.rebuild is None:
            raise NotImplementedError("this retriever cannot rebuild its index")
        async for progress in self.rebuild(request.batch):
            yield memory_pb2.RebuildIndexProgress(phase=progress.phase, done=progress.done, total=progress.total,
                                                  index=progress.index)


def registration(store: DocumentStore, queries: StructuredStore, retrieval: handlers.Retrieval,
                 rebuild=None) -> Registration:
    return Registration(memory_pb2_grpc.add_RetrieverServicer_to_server,
                        RetrieverServicer(store, queries, retrieval, rebuild), "mnemesh.v1.Retriever", SCOPES)
