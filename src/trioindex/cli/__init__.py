"""The ``trioindex`` command line: worker, migrate, ingest, search, status, jobs, healthcheck,
serve and keys.

Every command that prints data takes ``--json``. Errors meant for people (bad configuration, a
database that is down, an unknown job, a model mismatch) print one line and exit non-zero;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the one Typer application.
from trioindex.cli import documents, operations, service
from trioindex.cli.common import app, friendly

__all__ = ["app", "documents", "friendly", "main", "operations", "service"]


def main() -> None:
    app()
