"""gRPC Retriever: translate only."""

from __future__ import annotations

from libs.protogen.mnemesh.v1 import memory_pb2, memory_pb2_grpc
from libs.rpc import Registration
from services.retriever.adapters.mapping import hit_to_proto, query_from_proto
from services.retriever.service_layer import handlers
from services.retriever.service_layer.ports import DocumentStore

__all__ = ["registration"]

SCOPES = {"Search": "memory:read"}


class RetrieverServicer(memory_pb2_grpc.RetrieverServicer):
    def __init__(self, store: DocumentStore, retrieval: handlers.Retrieval) -> None:
        self.store, self.retrieval = store, retrieval

    async def Search(self, request, context):
        # The auth interceptor refuses a request whose tenant is not the token's, so the request's
        # tenant is the caller's here.
        hits = await handlers.search(query_from_proto(request), self.store, self.retrieval)
        return memory_pb2.SearchResponse(hits=[hit_to_proto(h) for h in hits])


def registration(store: DocumentStore, retrieval: handlers.Retrieval) -> Registration:
    return Registration(memory_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(store, retrieval),
                        "mnemesh.v1.Retriever", SCOPES)
