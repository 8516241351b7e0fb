"""Hostile queries through ``trioindex search`` (subprocesses) and :class:`trioindex.Index`, on a
real PostgreSQL + pgvector holding a few indexed documents and a TEI-speaking server that gives
one kind of text an all-zero vector: each query is answered or refused alone, and every output
line is strict JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import trioindex
from testkit.embed_server import fake_vector
from testkit.processes import base_env
from testkit.search_corpus import IndexedDocument, store_indexed
from tests.search.zero_embedder import ZERO_MARK, ZeroEmbedServer
from trioindex.config import load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.search import (
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    QUERY_INVALID,
    ChunkHit,
    QueryRefused,
    SearchMode,
    hybrid_fusion,
    text_ranking,
    vector_ranking,
)
from trioindex.search.answers import (
    HYBRID_TEXT_DEPTH_PER_CHUNK,
    HYBRID_VECTOR_DEPTH_PER_CHUNK,
    MIN_CANDIDATES,
)

MODEL, DIM = "test/zero-4", 4

DOCUMENTS = {
    "fr/cafe.txt": ["Le café ouvre à sept heures."],
    "ko/seoul.txt": ["서울은 대한민국의 수도입니다."],
    "en/lease.txt": ["The lease is renewed by a background task.", "Workers claim jobs."],
}


@pytest.fixture
def embedder() -> Iterator[ZeroEmbedServer]:
    with ZeroEmbedServer(dimension=DIM, model=MODEL) as server:
        yield server


@pytest.fixture
def env(
    database_url: str, db: Database, embedder: ZeroEmbedServer, tmp_path: Path
) -> dict[str, str]:
    """The documents above, indexed with the server's vectors, plus one chunk stored with an
    all-zero vector (as a database written before vectors were checked may hold)."""
    docs = [
        IndexedDocument(key, texts, [fake_vector(t, DIM) for t in texts])
        for key, texts in DOCUMENTS.items()
    ]
    docs.append(IndexedDocument("legacy/zero.txt", ["lease zero"], [[0.0] * DIM]))
    with db.connection() as conn:
        store_indexed(conn, ensure_model(conn, MODEL, DIM), docs)
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embedder.url,
        TRIOINDEX_EMBEDDING_MODEL=MODEL,
        TRIOINDEX_EMBEDDING_DIMENSION=str(DIM),
        TRIOINDEX_HOME=str(tmp_path / "home"),
    )


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    """``trioindex ARGS`` with its output as bytes, so a test sees exactly what was written."""
    return subprocess.run(
        [sys.executable, "-m", "trioindex.cli", *args],
        env=env,
        capture_output=True,
        timeout=180,
        check=False,
    )


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


def strict_json(line: bytes) -> Any:
    """``line`` parsed as JSON by the book: UTF-8, no NaN or Infinity."""
    return json.loads(line.decode("utf-8", errors="strict"), parse_constant=_no_constant)


def nfd(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    assert decomposed != text
    return decomposed


def query_line(query_id: object, text: str) -> str:
    return json.dumps({"id": query_id, "text": text})  # ASCII: lone surrogates as \ud800


# Hangul words of 60 syllables, each ending in a particle: 64 of them fit in MAX_QUERY_CHARS but
# make a tsquery tier over PostgreSQL's 1 MB (each term is the word and its stem, 63 times).
LONG_KOREAN = " ".join(
    "".join(chr(0xAC00 + (w * 59 + s) % 11172) for s in range(59)) + "은" for w in range(64)
)
OPERATORS = ["&", "|", "!", "<->", "<2>", ":", "*", "(", ")", "'", "\\", "':*", "''", "'\\''"]

# (line, what the answer must be): ("results", a key among them or None) or ("error", code)
BATCH: list[tuple[str, tuple[str, str | None]]] = [
    (query_line("plain", "café"), ("results", "fr/cafe.txt")),
    (query_line("nfd-cafe", nfd("café")), ("results", "fr/cafe.txt")),
    (query_line("nfd-seoul", nfd("서울은")), ("results", "ko/seoul.txt")),
    (query_line("nul", "lea\u0000se"), ("error", QUERY_INVALID)),
    (query_line("nuls", "\u0000" * 100), ("error", QUERY_INVALID)),
    (
        query_line("controls", "".join(map(chr, range(1, 32))) + "\x7f\x85\x9flease"),
        ("results", "en/lease.txt"),
    ),
    (query_line("megabyte", "lease " * 200_000), ("error", QUERY_INVALID)),
    (query_line("50k-terms", " ".join(f"w{i}" for i in range(50_000))), ("error", QUERY_INVALID)),
    (
        query_line("too-many-terms", " ".join(f"t{i}" for i in range(MAX_QUERY_TERMS + 1))),
        ("error", QUERY_INVALID),
    ),
    (
        query_line(
            "most-terms", " ".join(["lease", *(f"t{i}" for i in range(MAX_QUERY_TERMS - 1))])
        ),
        ("results", "en/lease.txt"),
    ),
    (query_line("longest", "lease" + " " * (MAX_QUERY_CHARS - 5)), ("results", "en/lease.txt")),
    (query_line("one-too-long", "lease" + " " * (MAX_QUERY_CHARS - 4)), ("error", QUERY_INVALID)),
    *((query_line(f"op{i}", op), ("results", None)) for i, op in enumerate(OPERATORS)),
    (query_line("operators", " ".join(OPERATORS) + " lease"), ("results", "en/lease.txt")),
    (query_line("tsquery", "!lease & (claim | task) <-> 'jobs':* \\"), ("results", None)),
    (query_line("lone-high", "\ud800lease"), ("error", QUERY_INVALID)),
    (query_line("lone-low", "lease \udfff"), ("error", QUERY_INVALID)),
    (query_line("\udc80", "lease"), ("results", "en/lease.txt")),  # the id comes back escaped
    (query_line("long-hangul-word", "가" * 1000), ("results", None)),
    (query_line("long-hangul-words", LONG_KOREAN), ("results", None)),
    (query_line("empty", ""), ("results", None)),
    (query_line("zero", f"{ZERO_MARK} lease"), ("results", "en/lease.txt")),  # text mode
    ("not json", ("error", QUERY_INVALID)),
    ('{"id": NaN, "text": "lease"}', ("error", QUERY_INVALID)),
    ('{"id": 1e999, "text": "lease"}', ("error", QUERY_INVALID)),
    ('{"id": 1' + "0" * 5000 + ', "text": "lease"}', ("error", QUERY_INVALID)),
    ('{"id": "deep", "text": ' + "[" * 100_000 + "]" * 100_000 + "}", ("error", QUERY_INVALID)),
    ('{"id": "no-text"}', ("error", QUERY_INVALID)),
    ('["lease"]', ("error", QUERY_INVALID)),
]


def _finite(number: str) -> float:
    value = float(number)
    assert math.isfinite(value), f"{number} is not a float64"
    return value


def expected_id(line: str) -> object:
    """The id a line's answer carries: None for a line that is not strict JSON."""
    try:
        parsed = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError, AssertionError):
        return None
    return parsed.get("id") if isinstance(parsed, dict) else None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["text", "hybrid"])
def test_a_hostile_batch_answers_or_refuses_each_query_alone(
    env: dict[str, str], tmp_path: Path, mode: str
) -> None:
    batch = list(BATCH)
    if mode == "hybrid":  # the zero vector refuses this query; its neighbours are answered
        batch = [
            (line, ("error", "EMBEDDING_RESULT_INVALID") if expected_id(line) == "zero" else want)
            for line, want in batch
        ]
    path = tmp_path / "queries.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"  # a byte order mark
        + "\n".join(line for line, _ in batch).encode()
        + b'\n{"id": "latin-1", "text": "caf\xe9 lease"}'  # not UTF-8: refused
        + b'\n{"id": "caf\xe9", "text": "lease"}\n\n'  # an id that is not UTF-8: answered
    )
    batch.append(('{"id": "latin-1"}', ("error", QUERY_INVALID)))
    batch.append(('{"id": "caf\\udce9"}', ("results", "en/lease.txt")))
    done = run_cli(env, "search", "--queries", str(path), "--mode", mode, "--top-k", "3")

    stderr = done.stderr.decode()
    refused = sum(kind == "error" for _, (kind, _) in batch)
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"trioindex: {refused} of {len(batch)} queries refused (see their errors)"
    )
    assert done.returncode == 1
    answers = [strict_json(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [expected_id(line) for line, _ in batch]
    for answer, (_, (kind, detail)) in zip(answers, batch, strict=True):
        assert set(answer) == {"id", kind}, (answer["id"], answer)
        if kind == "error":
            assert answer["error"]["code"] == detail, answer
            assert "lease" not in answer["error"]["message"]  # never the query text
            continue
        keys = [hit["document_key"] for hit in answer["results"]]
        if detail is not None:
            assert detail in keys, (answer["id"], keys)
    limits = {a["id"]: a["error"]["message"] for a in answers if "error" in a}
    assert f"limit is {MAX_QUERY_CHARS:,}" in limits["megabyte"]
    assert f"limit is {MAX_QUERY_TERMS}" in limits["too-many-terms"]


@pytest.mark.slow
def test_a_query_whose_vector_cannot_be_ranked_is_one_line(env: dict[str, str]) -> None:
    for mode in ("vector", "hybrid"):
        done = run_cli(env, "search", f"{ZERO_MARK} lease", "--mode", mode, "--json")
        assert done.returncode == 1
        assert done.stdout == b""
        [line] = done.stderr.decode().splitlines()
        assert line.startswith("trioindex: this query's vector cannot be ranked: ")
        assert "zero or near-zero norm" in line


@pytest.mark.slow
def test_search_json_is_strict_json_even_over_a_stored_zero_vector(env: dict[str, str]) -> None:
    for extra in ((), ("--chunks",)):
        done = run_cli(
            env, "search", "lease zero", "--mode", "vector", "--json", "--top-k", "10", *extra
        )
        assert done.returncode == 0, done.stderr.decode()
        hits = strict_json(done.stdout)
        keys = {hit["document_key"] for hit in hits}
        assert keys == set(DOCUMENTS)  # every document but the one without a direction


async def test_search_many_refuses_a_zero_vector_query_and_answers_the_others(
    env: dict[str, str], embedder: ZeroEmbedServer, tmp_path: Path
) -> None:
    settings = load_settings(environ=env, cwd=tmp_path)
    queries = ["lease", f"{ZERO_MARK} lease", "café", "x" * (MAX_QUERY_CHARS + 1)]
    async with trioindex.Index.open(settings) as index:
        embedder.batches.clear()
        lease, zero, cafe, too_long = await index.search_many(queries, mode="hybrid")
        # the three queries that could be embedded went together, then one at a time
        assert embedder.batches == [3, 1, 1, 1]
        assert isinstance(zero, QueryRefused) and zero.code == "EMBEDDING_RESULT_INVALID"
        assert isinstance(too_long, QueryRefused) and too_long.code == QUERY_INVALID
        assert not isinstance(lease, QueryRefused) and not isinstance(cafe, QueryRefused)
        assert lease[0].document_key == "en/lease.txt"
        assert cafe[0].document_key == "fr/cafe.txt"
        with pytest.raises(QueryRefused, match="cannot be ranked"):
            await index.search(f"{ZERO_MARK} again", mode="vector")
        with pytest.raises(QueryRefused, match="key_prefix must not contain a NUL"):
            await index.search("lease", mode="text", key_prefix="en/\x00")


async def test_decomposed_queries_find_composed_documents(
    env: dict[str, str], tmp_path: Path
) -> None:
    settings = load_settings(environ=env, cwd=tmp_path)
    async with trioindex.Index.open(settings) as index:
        for query, key in (
            ("café", "fr/cafe.txt"),
            ("서울은", "ko/seoul.txt"),
            ("서울에서", "ko/seoul.txt"),
        ):
            for text in (query, nfd(query)):
                hits = await index.search(text, mode="text")
                assert [h.document_key for h in hits] == [key], text


async def test_hybrid_ranks_its_halves_at_once_as_one_connection_ranks_them_in_turn(
    env: dict[str, str], embedder: ZeroEmbedServer, db: Database, tmp_path: Path
) -> None:
    settings = load_settings(environ=env, cwd=tmp_path)
    queries = ["lease workers", "서울 café", "background task"]
    async with trioindex.Index.open(settings) as index:
        # the queries at once: their text rankings, embeddings and vector rankings interleave
        answers = await index.search_chunks_many(queries, mode="hybrid", top_k=10)
    with db.connection() as conn:
        model = ensure_model(conn, MODEL, DIM)
        for query, answer in zip(queries, answers, strict=True):
            assert not isinstance(answer, QueryRefused)
            # as Index ranks them for a top 10 chunks: text 30 deep, vector 20
            by_vector = vector_ranking(
                conn, model, embedder.vector(query), HYBRID_VECTOR_DEPTH_PER_CHUNK * 10
            )
            by_text = text_ranking(conn, model, query, HYBRID_TEXT_DEPTH_PER_CHUNK * 10)
            alone = hybrid_fusion(by_vector, by_text)[:10]
            assert [(h.document_key, h.text, h.score) for h in answer] == [
                (r.document_key, r.text, pytest.approx(r.score)) for r in alone
            ], query
            assert answer, query


async def test_hybrid_chunk_search_fuses_a_vector_list_twice_the_chunks_asked_for_deep(
    env: dict[str, str], embedder: ZeroEmbedServer, db: Database, tmp_path: Path
) -> None:
    # 60 chunks that all hold "lease": the text list is 3 × top_k deep, the vector list
    # 2 × top_k; a chunk one ranking puts past its depth counts only by the other's rank
    texts = [f"lease clause {i} " + "term " * (i % 7) for i in range(60)]
    with db.connection() as conn:
        model = ensure_model(conn, MODEL, DIM)
        store_indexed(
            conn,
            model,
            [
                IndexedDocument(f"many/{i:02}", [t], [fake_vector(t, DIM)])
                for i, t in enumerate(texts)
            ],
        )
    settings = load_settings(environ=env, cwd=tmp_path)
    queries = ["lease", "lease term", "clause term"]
    async with trioindex.Index.open(settings) as index:
        answers = await index.search_chunks_many(queries, mode="hybrid", top_k=3)
    deeper = []
    with db.connection() as conn:
        for query, answer in zip(queries, answers, strict=True):
            assert not isinstance(answer, QueryRefused)
            vector = embedder.vector(query)
            by_text = text_ranking(conn, model, query, HYBRID_TEXT_DEPTH_PER_CHUNK * 3)
            by_vector = vector_ranking(conn, model, vector, HYBRID_VECTOR_DEPTH_PER_CHUNK * 3)
            expected = hybrid_fusion(by_vector, by_text)[:3]
            assert [(h.document_key, h.score) for h in answer] == [
                (r.document_key, pytest.approx(r.score)) for r in expected
            ], query
            full = hybrid_fusion(
                vector_ranking(conn, model, vector, MIN_CANDIDATES),
                text_ranking(conn, model, query, MIN_CANDIDATES),
            )
            deeper.append([r.document_key for r in full[:3]])
    # the depths matter on this corpus: 50-deep lists fuse to another top 3
    assert deeper != [[h.document_key for h in a] for a in answers if isinstance(a, list)]


def marked_words(hit: ChunkHit) -> list[str]:
    return [hit.text[a:b] for a, b in hit.matches]


# A batch marked together, in every mode: plain, Korean with a particle, decomposed, stop words
# only, tsquery operators, past the term limit (a refusal in text modes, no marks in vector
# mode), not text at all (refused in every mode).
MARKED_BATCH = [
    "lease workers",
    "서울에서",
    nfd("café"),
    "the of",
    "!lease & (claim | task) <-> 'jobs':* \\",
    " ".join(["lease", *(f"t{i}" for i in range(MAX_QUERY_TERMS))]),
    "lea\u0000se",
]
MARKS = {  # the words each query's terms mark, per chunk text (any other chunk: none)
    "lease workers": {
        "The lease is renewed by a background task.": ["lease"],
        "Workers claim jobs.": ["Workers"],
        "lease zero": ["lease"],
    },
    "서울에서": {"서울은 대한민국의 수도입니다.": ["서울은"]},
    nfd("café"): {"Le café ouvre à sept heures.": ["café"]},
    "!lease & (claim | task) <-> 'jobs':* \\": {
        "The lease is renewed by a background task.": ["lease", "task"],
        "Workers claim jobs.": ["claim", "jobs"],
        "lease zero": ["lease"],
    },
}


@pytest.mark.parametrize("mode", ["vector", "text", "hybrid"])
async def test_a_batch_is_marked_in_one_statement_as_each_query_alone_is(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: SearchMode
) -> None:
    settings = load_settings(environ=env, cwd=tmp_path)
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    async with trioindex.Index.open(settings) as index:
        alone = [await index.search_chunks_many([q], mode=mode, top_k=10) for q in MARKED_BATCH]
        documents_alone = [await index.search_many([q], mode=mode, top_k=10) for q in MARKED_BATCH]
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        together = await index.search_chunks_many(MARKED_BATCH, mode=mode, top_k=10)
        chunk_statements = list(sent)
        sent.clear()
        documents = await index.search_many(MARKED_BATCH, mode=mode, top_k=10)

    # one statement reads every query's terms (and the collection BM25 scores in), one marks
    # every hit, for the batch
    for statements in (chunk_statements, sent):
        assert sum("ts_headline" in s for s in statements) == 1
        assert sum("to_tsvector('english'" in s for s in statements) == 1
        assert sum("sum(text_length)" in s for s in statements) == 1
    refused_in_text_modes = {MARKED_BATCH[5]} if mode != "vector" else set()
    for query, answer, (one,), (document_one,), document_answer in zip(
        MARKED_BATCH, together, alone, documents_alone, documents, strict=True
    ):
        if "\x00" in query or query in refused_in_text_modes:
            assert isinstance(answer, QueryRefused) and answer.code == QUERY_INVALID
            assert isinstance(document_answer, QueryRefused)
            continue
        assert not isinstance(answer, QueryRefused) and not isinstance(one, QueryRefused)
        assert not isinstance(document_answer, QueryRefused)
        assert not isinstance(document_one, QueryRefused)
        # same hits, same order, same scores, same marks as the query asked alone
        assert answer == one
        assert document_answer == document_one
        expected = MARKS.get(query, {})
        for hit in answer:
            assert marked_words(hit) == expected.get(hit.text, []), (query, hit.text)
        chunk_marks = {(h.document_key, h.chunk_index): h.matches for h in answer}
        for document in document_answer:
            for chunk in document.chunks:
                assert marked_words(chunk) == expected.get(chunk.text, []), (query, chunk.text)
                if (document.document_key, chunk.chunk_index) in chunk_marks:
                    assert chunk.matches == chunk_marks[document.document_key, chunk.chunk_index]
