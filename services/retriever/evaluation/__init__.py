"""Retrieval evaluation: a conversational-memory dataset format, its loader, the harness and its report."""

from services.retriever.evaluation.harness import DATASET, Dataset, evaluate, format_table, load_dataset

__all__ = ["DATASET", "Dataset", "evaluate", "format_table", "load_dataset"]
