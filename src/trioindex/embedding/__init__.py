"""Embedding clients: one :class:`Embedder` interface over TEI, OpenAI-compatible servers and an
in-process sentence-transformers model, chosen by :func:`open_embedder` from configuration.

Modules: ``base`` (the contract and the factory), ``transport`` (HTTP and its error translation),
``tei`` / ``openai`` / ``local`` (the providers), ``batching`` (batches and the in-flight cap),
``vectors`` (validation and the vector hash).
"""

from __future__ import annotations

from trioindex.embedding.base import APIS, Embedder, EmbedderInfo, open_embedder
from trioindex.embedding.batching import estimate_tokens, plan_batches
from trioindex.embedding.local import DEFAULT_MODEL, LocalEmbedder, packaged_model_path
from trioindex.embedding.vectors import validate_vectors, vector_sha256

__all__ = [
    "APIS",
    "DEFAULT_MODEL",
    "Embedder",
    "EmbedderInfo",
    "LocalEmbedder",
    "estimate_tokens",
    "open_embedder",
    "packaged_model_path",
    "plan_batches",
    "validate_vectors",
    "vector_sha256",
]
