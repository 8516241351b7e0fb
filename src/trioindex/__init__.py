"""trioindex: a Trio worker fleet that turns uploaded documents into pgvector embeddings.

Jobs are claimed from PostgreSQL with ``FOR UPDATE SKIP LOCKED`` under a renewable lease; each
claimed job runs parse/chunk → embed → complete in its own nursery beside its lease renewal.
The public Python API is re-exported here; the CLI lives in :mod:`trioindex.cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The API is imported on first use (PEP 562), so `import trioindex` (and the CLI's start-up)
# does not pay for the database, storage and embedding imports.
_API = {
    "Index": "trioindex.api.index",
    "SyncIndex": "trioindex.api.sync_index",
    "IngestReport": "trioindex.api.reports",
    "connect": "trioindex.api.sync_index",
    "DocumentHit": "trioindex.search",
    "ChunkHit": "trioindex.search",
    "load_settings": "trioindex.config",
    "Settings": "trioindex.config",
}
__all__ = [
    "ChunkHit",
    "DocumentHit",
    "Index",
    "IngestReport",
    "Settings",
    "SyncIndex",
    "__version__",
    "connect",
    "load_settings",
]

if TYPE_CHECKING:
    from trioindex.api.index import Index
    from trioindex.api.reports import IngestReport
    from trioindex.api.sync_index import SyncIndex, connect
    from trioindex.config import Settings, load_settings
    from trioindex.search import ChunkHit, DocumentHit


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'trioindex' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
