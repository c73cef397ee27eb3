from services.retriever.domain.search import Document, Hit, SearchQuery, rank

__all__ = ["Document", "Hit", "SearchQuery", "rank"]
