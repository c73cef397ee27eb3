from services.retriever.domain.search import MODES, Candidate, Document, Hit, SearchQuery, fuse, rescore
from services.retriever.domain.sparse import Bm25, SparseVector, redact, terms

__all__ = ["MODES", "Bm25", "Candidate", "Document", "Hit", "SearchQuery", "SparseVector", "fuse", "redact",
           "rescore", "terms"]
