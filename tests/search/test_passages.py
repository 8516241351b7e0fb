"""Snippets at the match: the window of sentences chosen, its cuts and the highlight offsets,
and the words PostgreSQL marks for a query (English stems, Korean prefixes) in every mode."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Connection, Database
from trioindex.search import ChunkHit, DocumentHit, document_hits, ranked_chunks
from trioindex.search.marking import mark_chunk_answers, mark_document_answers
from trioindex.search.passages import MARK_START, MARK_STOP, Passage, match_offsets, passage
from trioindex.search.ranking import queries_terms

ANSWER = "Running git rebase --update-refs deletes references it cannot move."
CHUNK = (
    "Rebasing is how you rewrite history. It has many options, most of them rare. "
    "The sequencer keeps its state in the repository while it runs.\n\n"
    f"{ANSWER} Nothing else here is about it."
)


def marked_chunk_hits(conn: Connection, text: str, hits: list[ChunkHit]) -> list[ChunkHit]:
    """One query's hits marked through the batch marking (as a search of one query does)."""
    (terms,) = queries_terms(conn, [text])
    (marked,) = mark_chunk_answers(conn, [(terms, hits)])
    return marked


def marked_document_hits(conn: Connection, text: str, hits: list[DocumentHit]) -> list[DocumentHit]:
    (terms,) = queries_terms(conn, [text])
    (marked,) = mark_document_answers(conn, [(terms, hits)])
    return marked


def shown(p: Passage) -> list[str]:
    return [p.text[a:b] for a, b in p.highlights]


def test_the_passage_is_the_sentence_window_with_the_most_matched_words() -> None:
    start = CHUNK.index("update")
    matches = [
        (start, start + 6),
        (start + 7, start + 11),
        (CHUNK.index("deletes"), CHUNK.index("deletes") + 7),
    ]
    p = passage(CHUNK, matches, 100)
    assert p.text.startswith("…The sequencer") or p.text.startswith("…" + ANSWER[:20])
    assert ANSWER in p.text and len(p.text) <= 100
    assert shown(p) == ["update", "refs", "deletes"]
    assert p.styled("<", ">").count("<") == 3 and "<update>-<refs>" in p.styled("<", ">")


def test_without_matches_the_passage_is_the_start_on_one_line() -> None:
    p = passage(CHUNK, (), 40)
    assert p == Passage(" ".join(CHUNK.split())[:39].rstrip() + "…")
    assert passage("short\n\n  text") == Passage("short text")
    assert passage("") == Passage("") and passage("  \n ") == Passage("")


def test_a_sentence_longer_than_the_width_is_cut_around_its_first_match() -> None:
    text = (
        " ".join(f"w{i}" for i in range(200)) + " needle " + " ".join(f"v{i}" for i in range(200))
    )
    at = text.index("needle")
    p = passage(text, [(at, at + 6)], 60)
    assert p.text.startswith("…") and p.text.endswith("…") and len(p.text) <= 60
    assert shown(p) == ["needle"]


def test_marks_are_read_back_as_offsets_and_hostile_text_marks_nothing() -> None:
    assert match_offsets(f"a {MARK_START}bc{MARK_STOP} d {MARK_START}e{MARK_STOP}") == (
        "a bc d e",
        ((2, 4), (7, 8)),
    )
    assert match_offsets("plain") == ("plain", ())


DIM = 4


@pytest.fixture
def model(db: Database) -> EmbeddingModel:
    with db.connection() as conn:
        return ensure_model(conn, "test-model", DIM)


def hit(text: str) -> ChunkHit:
    return ChunkHit(1, 1.0, "k", uuid.uuid4(), 1, 0, text)


def test_postgresql_marks_stems_and_korean_prefixes(db: Database) -> None:
    with db.connection() as conn:
        (h,) = marked_chunk_hits(
            conn, "worker renewal 서울에서", [hit("Workers renew leases. 서울은 크다.")]
        )
        assert [h.text[a:b] for a, b in h.matches] == ["Workers", "renew", "서울은"]
        # no text terms (stop words only), a query past the term limit, private-use marks in
        # the text: nothing marked, nothing refused
        assert marked_chunk_hits(conn, "the of", [hit("the of")])[0].matches == ()
        long_query = " ".join(f"word{i}" for i in range(100))
        assert marked_chunk_hits(conn, long_query, [hit("word1")])[0].matches == ()
        odd = hit(f"worker {MARK_START}x{MARK_STOP}")
        assert marked_chunk_hits(conn, "worker", [odd])[0].matches == ()


def test_document_hits_carry_highlights_in_their_json(db: Database, model: EmbeddingModel) -> None:
    v = list(np.ones(DIM) / 2)
    store_indexed_docs = [IndexedDocument("a.txt", [CHUNK, "other text"], [v, v])]
    with db.connection() as conn:
        store_indexed(conn, model, store_indexed_docs)
        rows = conn.execute(
            """SELECT c.id AS chunk_id, 1.0 AS score, d.external_key, d.id AS document_id,
                      1 AS version_no, 'text/plain' AS content_type, c.chunk_index, c.content
               FROM document_chunks c JOIN documents d ON d.id = c.document_id
               ORDER BY c.chunk_index"""
        ).fetchall()
        hits = document_hits(ranked_chunks(rows), 5, 2)
        (doc,) = marked_document_hits(conn, "update refs deleted", hits)
    element = doc.as_json()["chunks"][0]
    assert set(element) == {"chunk_index", "score", "snippet", "highlights"}
    assert [element["snippet"][a:b] for a, b in element["highlights"]] == [
        "update",
        "refs",
        "deletes",
    ]
    chunk = doc.chunks[0].as_json()
    assert [chunk["text"][a:b] for a, b in chunk["matches"]] == ["update", "refs", "deletes"]
    assert doc.as_json()["chunks"][1]["highlights"] == []
