"""trioindex: a Trio worker fleet that turns uploaded documents into pgvector embeddings.

Jobs are claimed from PostgreSQL with ``FOR UPDATE SKIP LOCKED`` under a renewable lease; each
claimed job runs parse/chunk → embed → complete in its own nursery beside its lease renewal.
The public Python API is re-exported here; the CLI lives in :mod:`trioindex.cli`.
"""

from __future__ import annotations

__version__ = "0.1.0"
