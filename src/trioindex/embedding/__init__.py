"""Embedding clients: one :class:`Embedder` interface over TEI, OpenAI-compatible servers and an
in-process sentence-transformers model, chosen by :func:`open_embedder` from configuration.

Modules: ``base`` (the contract and the factory), ``transport`` (HTTP and its error translation),
``tei`` / ``openai`` / ``local`` (the providers), ``batching`` (batches and the in-flight cap),
``vectors`` (what every embedder answers, :class:`Vectors`: its checks and the vector hash).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trioindex.embedding.base import APIS, Embedder, EmbedderInfo, open_embedder

if TYPE_CHECKING:
    from trioindex.embedding.batching import estimate_tokens, plan_batches
    from trioindex.embedding.local import DEFAULT_MODEL, LocalEmbedder, packaged_model_path
    from trioindex.embedding.vectors import Vectors, validate_vectors, vector_sha256

# Imported when first used: batching brings numpy and the HTTP client, which a search that
# borrows a loaded model (or runs text-only) never needs, and every CLI start would pay for.
_LAZY = {
    "estimate_tokens": "batching",
    "plan_batches": "batching",
    "DEFAULT_MODEL": "local",
    "LocalEmbedder": "local",
    "packaged_model_path": "local",
    "Vectors": "vectors",
    "validate_vectors": "vectors",
    "vector_sha256": "vectors",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "APIS",
    "DEFAULT_MODEL",
    "Embedder",
    "EmbedderInfo",
    "LocalEmbedder",
    "Vectors",
    "estimate_tokens",
    "open_embedder",
    "packaged_model_path",
    "plan_batches",
    "validate_vectors",
    "vector_sha256",
]
