"""docs/design/state-machine.md's transition table is the code's: every status the code writes
is listed there with the function that writes it, and every listed write is made by that
function.

The code is read, not run: each SQL function of functions.sql and each top-level function or
statement constant of the Python modules is a "writer"; in it, every ``UPDATE <table> SET
status = ...`` (literals, or a ``CASE`` of literals) and every ``INSERT`` naming a status
literal is one write of (entity, status), and so is every ``INSERT INTO
embedding_job_attempts`` of ``trioindex_ended_attempt(job, '<status>', ...)`` (an attempt's row
is written when it ends, from its job row). Inserts that take the column's default are listed
in the table as ``(insert, default)`` and not scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design" / "state-machine.md"
SOURCES = ROOT / "src" / "trioindex"
ENTITIES = {
    "embedding_jobs": "job",
    "embedding_job_attempts": "attempt",
    "indexing_workers": "worker",
}

_UPDATE = re.compile(
    r"UPDATE\s+(\w+)(?:\s+(?!SET\b)\w+)?\s+SET\s+(.*?)(?=\bWHERE\b|\bFROM\b|\bRETURNING\b|;|\"\"\")",
    re.S,
)
_STATUS_SET = re.compile(r"\bstatus\s*=\s*(CASE\b.*?\bEND|'[A-Z]+')", re.S)
_INSERT = re.compile(r"INSERT INTO\s+(\w+)\s*\(([^)]*)\)\s*VALUES\s*\(([^)]*)\)", re.S)
_LITERAL = re.compile(r"'([A-Z]+)'")
_ENDED_ATTEMPT = re.compile(
    r"INSERT INTO\s+embedding_job_attempts\b(?:(?!INSERT INTO).)*?"
    r"trioindex_ended_attempt\(\s*[\w.]+,\s*'([A-Z]+)'",
    re.S,
)


def _segments() -> list[tuple[str, str]]:
    """(writer name, text) for every SQL function and every top-level Python definition."""
    found: list[tuple[str, str]] = []
    sql = (SOURCES / "db" / "migrations" / "functions.sql").read_text()
    parts = re.split(r"^CREATE FUNCTION (\w+)", sql, flags=re.M)
    found += [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]
    top = re.compile(r"^(?:async def |def |class )?(\w+)\b(?:\s*[(:=]| =)", re.M)
    for path in sorted(SOURCES.rglob("*.py")):
        text = path.read_text()
        starts = [(m.start(), m.group(1)) for m in top.finditer(text)]
        ends = [start for start, _ in starts[1:]] + [len(text)] if starts else []
        for (start, name), end in zip(starts, ends, strict=True):
            found.append((f"{path.stem}.{name}", text[start:end]))
    return found


def _code_writes() -> set[tuple[str, str, str]]:
    writes = set()
    for writer, text in _segments():
        for table, assignments in _UPDATE.findall(text):
            if table not in ENTITIES:
                continue
            for expression in _STATUS_SET.findall(assignments):
                for status in _LITERAL.findall(expression):
                    writes.add((ENTITIES[table], status, writer))
        for table, columns, values in _INSERT.findall(text):
            names = [c.strip() for c in columns.split(",")]
            if table in ENTITIES and "status" in names:
                value = [v.strip() for v in values.split(",")][names.index("status")]
                writes.update((ENTITIES[table], s, writer) for s in _LITERAL.findall(value))
        writes.update(("attempt", status, writer) for status in _ENDED_ATTEMPT.findall(text))
    return writes


def _doc_rows() -> list[tuple[str, str, str, str]]:
    text = DOC.read_text()
    table = text.split("<!-- transitions: the test parses the rows of this table -->", 1)[1]
    rows = []
    for line in table.split("\n\n", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ENTITIES.values():
            rows.append((cells[0], cells[2], cells[3], cells[1]))
    return rows


def _doc_writes(*, defaults: bool) -> set[tuple[str, str, str]]:
    writes = set()
    for entity, status, function, _ in _doc_rows():
        is_default = "(insert, default)" in function
        if is_default == defaults:
            writes.add((entity, status, function.split("`")[1]))
    return writes


def test_the_table_lists_every_status_the_code_writes_and_nothing_else() -> None:
    code, doc = _code_writes(), _doc_writes(defaults=False)
    assert code, "the scanner found no status writes at all: it is broken"
    assert sorted(code - doc) == [], "written by the code but not in state-machine.md"
    assert sorted(doc - code) == [], "in state-machine.md but not written by that function"


def test_every_status_a_check_constraint_allows_has_a_way_in() -> None:
    """A status the schema allows but no transition reaches is dead (as CHUNKED was)."""
    migrations = "\n".join(
        p.read_text() for p in sorted((SOURCES / "db" / "migrations").glob("0*.sql"))
    )
    reached = {(entity, status) for entity, status, _, _ in _doc_rows()}
    for table, entity in ENTITIES.items():
        checks = re.findall(
            rf"(?:CREATE TABLE {table} \(.*?status\s+text[^,]*?CHECK \(status IN \(([^)]*)\)"
            rf"|{table}_status_check\s+CHECK \(status IN \(([^)]*)\))",
            migrations,
            re.S,
        )
        allowed = set(_LITERAL.findall("".join(a or b for a, b in checks[-1:])))
        assert allowed, f"no status check found for {table}"
        assert allowed == {s for e, s in reached if e == entity}, table


def test_the_default_inserts_listed_exist() -> None:
    segments = dict(_segments())
    for entity, _, writer in _doc_writes(defaults=True):
        table = next(t for t, e in ENTITIES.items() if e == entity)
        assert f"INSERT INTO {table}" in segments[writer], writer
