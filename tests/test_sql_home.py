"""Only ``trioindex.db`` reads or writes the lifecycle's tables: every other package calls its
typed functions. A statement on one of these tables in another module fails this test with
the module and the table."""

from __future__ import annotations

import re
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[1] / "src" / "trioindex"
TABLES = (
    "embedding_jobs",
    "embedding_job_attempts",
    "document_versions",
    "documents",
    "document_chunks",
    "embeddings",
    "indexing_events",
    "served_versions",
    "embedding_models",
    "indexing_workers",
)
STATEMENT = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+(" + "|".join(TABLES) + r")\b", re.IGNORECASE
)


def test_no_module_outside_db_touches_a_lifecycle_table() -> None:
    found = []
    for path in sorted(SOURCES.rglob("*.py")):
        relative = path.relative_to(SOURCES)
        if relative.parts[0] == "db":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in STATEMENT.finditer(line):
                found.append(f"{relative}:{number}: {match.group(1)}")
    assert found == []


def test_the_pattern_finds_a_statement() -> None:
    assert STATEMENT.search('conn.execute("SELECT id FROM embedding_jobs WHERE ...")')
    assert not STATEMENT.search("a job's document versions, from the embeddings")
