"""The ranking queries on a real PostgreSQL + pgvector: what each mode ranks first, the filters,
current versions only, and reciprocal rank fusion; grouping by document."""

from __future__ import annotations

import math
import re
import uuid

import attrs
import numpy as np
import pytest

from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.db import search as db_search
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Connection, Database
from trioindex.db.search import CandidateBranch, Collection, TextTerm
from trioindex.db.vector_index import build_vector_index
from trioindex.search import (
    HYBRID_K,
    HYBRID_TEXT_WEIGHT,
    RRF_K,
    Bm25,
    Filters,
    RankedChunk,
    document_hits,
    fuse,
    hangul_terms,
    hybrid_ranking,
    text_ranking,
    vector_ranking,
)
from trioindex.search.ranking import (
    COMMON_CAP,
    MANY_COMMON_TERMS,
    PAIR_CANDIDATES_PER_RESULT,
    candidate_branches,
    queries_terms_and_collection,
    query_terms,
    vector_counts,
)
from trioindex.search.statistics import forget, term_statistics

DIM = 4


def unit(*values: float) -> list[float]:
    v = np.asarray(values, dtype=np.float64)
    return list(v / np.linalg.norm(v))


@pytest.fixture
def model(db: Database) -> EmbeddingModel:
    with db.connection() as conn:
        return ensure_model(conn, "test-model", DIM)


def store(db: Database, model: EmbeddingModel, *documents: IndexedDocument) -> dict[str, uuid.UUID]:
    with db.connection() as conn:
        return store_indexed(conn, model, documents)


def keys(ranked: list[RankedChunk]) -> list[tuple[str, int]]:
    return [(r.document_key, r.chunk_index) for r in ranked]


def test_vector_ranking_orders_by_cosine_over_current_versions_only(
    db: Database, model: EmbeddingModel
) -> None:
    ids = store(
        db,
        model,
        IndexedDocument("near.txt", ["a", "b"], [unit(1, 0, 0, 0), unit(0, 1, 0, 0)]),
        IndexedDocument("mid.txt", ["c"], [unit(1, 1, 0, 0)]),
        IndexedDocument("gone.txt", ["d"], [unit(1, 0, 0, 0)]),
    )
    with db.connection() as conn:
        conn.execute("DELETE FROM served_versions WHERE document_id = %s", (ids["gone.txt"],))
        ranked = vector_ranking(conn, model, unit(1, 0, 0, 0), 10)
    assert keys(ranked) == [("near.txt", 0), ("mid.txt", 0), ("near.txt", 1)]
    assert ranked[0].score == pytest.approx(1.0)
    assert ranked[1].score == pytest.approx(np.sqrt(0.5))
    assert ranked[2].score == pytest.approx(0.0, abs=1e-6)


def found_by_both(conn: Connection, model: EmbeddingModel, filters: Filters) -> set[str]:
    """The documents the vector and the text ranking both return under ``filters`` (for a
    chunk "x" of vector (1, 0, 0, 0)): the two rankings keep the same."""
    by_vector = {
        r.document_key for r in vector_ranking(conn, model, unit(1, 0, 0, 0), 10, filters=filters)
    }
    by_text = {r.document_key for r in text_ranking(conn, model, "x", 10, filters=filters)}
    assert by_vector == by_text
    return by_vector


def test_filters_keep_a_key_prefix_and_content_types(db: Database, model: EmbeddingModel) -> None:
    v = unit(1, 0, 0, 0)
    store(
        db,
        model,
        IndexedDocument("papers/a.md", ["x"], [v], "text/markdown"),
        IndexedDocument("papers/b.pdf", ["x"], [v], "application/pdf"),
        IndexedDocument("papersX/c.md", ["x"], [v], "text/markdown"),
        IndexedDocument("notes/d.txt", ["x"], [v], "text/plain"),
        IndexedDocument("notes/e", ["x"], [v], None),
    )
    with db.connection() as conn:

        def found(filters: Filters) -> set[str]:
            return found_by_both(conn, model, filters)

        assert found(Filters()) == {
            "papers/a.md",
            "papers/b.pdf",
            "papersX/c.md",
            "notes/d.txt",
            "notes/e",
        }
        assert found(Filters(key_prefix="papers/")) == {"papers/a.md", "papers/b.pdf"}
        assert found(Filters(content_types=("text/markdown",))) == {"papers/a.md", "papersX/c.md"}
        assert found(Filters(content_types=("text",))) == {
            "papers/a.md",
            "papersX/c.md",
            "notes/d.txt",
        }
        assert found(Filters("papers/", ("text", "application/pdf"))) == {
            "papers/a.md",
            "papers/b.pdf",
        }
        # LIKE wildcards in a prefix are plain characters
        assert found(Filters(key_prefix="papers_")) == set()


def test_hostile_filter_values_keep_what_they_say_in_both_rankings(
    db: Database, model: EmbeddingModel
) -> None:
    # a prefix is plain characters (no LIKE wildcard or escape, quotes as written, any
    # unicode), an empty prefix or type list is no filter, a long type list is one value, and
    # the OCR mark is kept or left out alike by the vector and the text ranking
    v = unit(1, 0, 0, 0)
    keys_ = ["a%b/1", "a_b/2", "a\\b/3", "it's/4", 'q"/5', "ünï 한/6", "axb/7"]
    ids = store(
        db,
        model,
        *(
            IndexedDocument(k, ["x"], [v], "text/plain" if i % 2 else "image/png")
            for i, k in enumerate(keys_)
        ),
    )
    with db.connection() as conn:
        conn.execute(
            "UPDATE document_versions SET ocr_low_confidence_pages = '{1}' WHERE document_id = %s",
            (ids["axb/7"],),
        )

        def found(filters: Filters) -> set[str]:
            return found_by_both(conn, model, filters)

        everything = set(keys_)
        for prefix in keys_:
            assert found(Filters(key_prefix=prefix[:-2])) == {prefix}
        assert found(Filters(key_prefix="a")) == {"a%b/1", "a_b/2", "a\\b/3", "axb/7"}
        assert found(Filters(key_prefix="%")) == set()
        assert found(Filters(key_prefix="")) == everything
        assert found(Filters(content_types=())) == everything
        many = tuple(f"type/{i}" for i in range(5000))
        assert found(Filters(content_types=many)) == set()
        assert found(Filters(content_types=(*many, "image"))) == {
            k for i, k in enumerate(keys_) if not i % 2
        }
        assert found(Filters(content_types=("image/png'",))) == set()
        assert found(Filters(low_confidence=True)) == {"axb/7"}
        assert found(Filters(low_confidence=False)) == everything - {"axb/7"}
        assert found(Filters("a", ("image",), low_confidence=False)) == {"a%b/1", "a\\b/3"}


def test_vector_ranking_through_the_index_returns_each_chunks_own_rows_under_filters(
    db: Database,
) -> None:
    # the candidates are ranked from the vectors and served rows alone and their rows read for
    # the kept ones: each hit still carries its own chunk's text, index, document, version and
    # content type, and a filter still applies to every candidate (both before and through
    # the index), so the filtered lists are the exact top 5 computed here
    dim, n = 16, 120
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    types = ["text/markdown", "application/pdf", "text/plain"]
    docs = [
        IndexedDocument(
            f"{'papers' if d % 2 else 'notes'}/{d:03}",
            [f"chunk {d}-{i}" for i in range(3)],
            vectors[3 * d : 3 * d + 3],
            types[d % 3],
        )
        for d in range(n // 3)
    ]
    unit_vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    query = vectors[40] + 0.05
    similarity = unit_vectors @ (query / np.linalg.norm(query))

    def expected(keep: Filters) -> list[tuple[str, int, str, str, float]]:
        rows = [
            (docs[i // 3].key, i % 3, f"chunk {i // 3}-{i % 3}", types[(i // 3) % 3], s)
            for i, s in enumerate(similarity)
        ]
        rows = [
            r
            for r in rows
            if r[0].startswith(keep.key_prefix or "")
            and (not keep.content_types or r[3] in keep.content_types)
        ]
        return sorted(rows, key=lambda r: -r[4])[:5]

    def ranked(conn: Connection, keep: Filters) -> list[tuple[str, int, str, str, float]]:
        return [
            (r.document_key, r.chunk_index, r.text, r.content_type or "", r.score)
            for r in vector_ranking(conn, model, query, 5, filters=keep)
        ]

    filters = [Filters(), Filters(key_prefix="papers/"), Filters(content_types=("text/plain",))]
    with db.connection() as conn:
        model = ensure_model(conn, "filtered", dim)
        store_indexed(conn, model, docs)
        before = [ranked(conn, keep) for keep in filters]
        assert build_vector_index(conn, model, min_vectors=n)
        after = [ranked(conn, keep) for keep in filters]
    for keep, exact, indexed in zip(filters, before, after, strict=True):
        truth = expected(keep)
        for found in (exact, indexed):
            assert [r[:4] for r in found] == [r[:4] for r in truth]
            assert [r[4] for r in found] == pytest.approx([r[4] for r in truth], abs=1e-5)


def test_text_ranking_matches_english_stems_and_korean_words_with_particles(
    db: Database, model: EmbeddingModel
) -> None:
    v = unit(1, 0, 0, 0)
    store(
        db,
        model,
        IndexedDocument(
            "en.txt",
            [
                "Workers claimed the jobs with SKIP LOCKED.",
                "The lease is renewed by a background task.",
                "Nothing here.",
            ],
            [v, v, v],
        ),
        IndexedDocument(
            "ko.txt", ["대한민국의 수도는 서울입니다.", "한글은 세종대왕이 만들었습니다."], [v, v]
        ),
    )
    with db.connection() as conn:
        # stems: "worker claims job" matches "Workers claimed the jobs"
        assert keys(text_ranking(conn, model, "worker claims job", 10)) == [("en.txt", 0)]
        # more of the query matched ranks first; stop words alone match nothing
        ranked = text_ranking(conn, model, "renewing the lease of a worker", 10)
        assert keys(ranked) == [("en.txt", 1), ("en.txt", 0)]
        assert text_ranking(conn, model, "the of a", 10) == []
        # Korean: a query word with its own particle still finds the word with another one
        assert keys(text_ranking(conn, model, "서울에서", 10)) == [("ko.txt", 0)]
        assert keys(text_ranking(conn, model, "세종대왕", 10)) == [("ko.txt", 1)]


def test_hybrid_puts_first_what_both_rankings_rank_high(
    db: Database, model: EmbeddingModel
) -> None:
    store(
        db,
        model,
        # closest vector, no word of the query
        IndexedDocument("vector-only.txt", ["unrelated words"], [unit(1, 0, 0, 0)]),
        # every word of the query, a far vector
        IndexedDocument("text-only.txt", ["lease renewal deadline"], [unit(-1, 0, 0, 0)]),
        IndexedDocument("filler.txt", ["one", "two"], [unit(0, 1, 0, 0), unit(0, 0, 1, 0)]),
        # second in both
        IndexedDocument("both.txt", ["lease"], [unit(1, 0.3, 0, 0)]),
    )
    with db.connection() as conn:
        query = unit(1, 0, 0, 0)
        assert keys(vector_ranking(conn, model, query, 10))[0] == ("vector-only.txt", 0)
        assert keys(text_ranking(conn, model, "lease renewal deadline", 10))[0] == (
            "text-only.txt",
            0,
        )
        ranked = hybrid_ranking(conn, model, "lease renewal deadline", query, 10)
    assert keys(ranked)[0] == ("both.txt", 0)
    assert ranked[0].score == pytest.approx((1 + HYBRID_TEXT_WEIGHT) / (HYBRID_K + 2))


def _ranked(key: str, index: int = 0) -> RankedChunk:
    return RankedChunk(uuid.uuid5(uuid.NAMESPACE_URL, f"{key}#{index}"), 0.0, key,
                       uuid.uuid5(uuid.NAMESPACE_URL, key), 1, None, index, "t")  # fmt: skip


def test_fuse_sums_reciprocal_ranks() -> None:
    a, b, c = _ranked("a"), _ranked("b"), _ranked("c")
    fused = fuse([[a, b], [c, b]])
    assert [r.document_key for r in fused] == ["b", "a", "c"]
    assert fused[0].score == pytest.approx(1 / (RRF_K + 2) * 2)
    assert fused[1].score == pytest.approx(1 / (RRF_K + 1))


def test_document_hits_group_chunks_so_one_document_cannot_fill_the_list() -> None:
    ranked = [_ranked("long", i) for i in range(6)] + [_ranked("short"), _ranked("long", 9)]
    ranked = [attrs.evolve(r, score=1.0 - n / 10) for n, r in enumerate(ranked)]
    [long, short] = document_hits(ranked, top_k=5, chunks_per_document=3)
    assert (long.rank, long.document_key, long.score) == (1, "long", 1.0)
    assert [c.chunk_index for c in long.chunks] == [0, 1, 2]
    assert (short.rank, short.document_key, short.score) == (2, "short", pytest.approx(0.4))
    assert [d.document_key for d in document_hits(ranked, 1, 1)] == ["long"]


def test_hangul_terms_strip_one_particle_when_two_syllables_stay() -> None:
    assert hangul_terms("no hangul") == []
    assert hangul_terms("서울에서 lease 수도는 서울에서") == [
        "('서울에서':* | '서울':*)",
        "('수도는':* | '수도':*)",
    ]
    assert hangul_terms("집은") == ["'집은':*"]  # one syllable would match too much


def _bm25_reference(
    conn: Connection, query: str, served: list[uuid.UUID], k1: float = 1.2, b: float = 0.75
) -> dict[tuple[str, int], float]:
    """BM25 (Lucene's form) computed here from the stored vectors' text, over the chunks of
    the ``served`` documents: tf = the positions of the query's lexemes, length = characters."""
    rows = conn.execute(
        """SELECT d.external_key, c.chunk_index, c.content, c.search_vector::text AS v
           FROM document_chunks c JOIN documents d ON d.id = c.document_id
           WHERE d.id = ANY(%s)""",
        (served,),
    ).fetchall()
    (lexemes,) = (
        conn.execute(
            "SELECT array(SELECT lexeme FROM unnest(to_tsvector('english', %s)))", (query,)
        )
        .fetchone()
        .values()
    )
    vectors = {}
    for row in rows:
        counts = {}
        for lexeme, positions in re.findall(r"'((?:[^']|'')+)':([\d,]+)", row["v"]):
            counts[lexeme] = len(positions.split(","))
        vectors[(row["external_key"], row["chunk_index"])] = (counts, len(row["content"]))
    n = len(vectors)
    average = sum(length for _, length in vectors.values()) / n
    scores = {}
    for key, (counts, length) in vectors.items():
        score = 0.0
        for term in lexemes:
            df = sum(1 for c, _ in vectors.values() if term in c)
            tf = counts.get(term, 0)
            if tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))
        if score:
            scores[key] = score
    return scores


def test_text_ranking_is_bm25_over_the_served_chunks(db: Database, model: EmbeddingModel) -> None:
    v = unit(1, 0, 0, 0)
    ids = store(
        db,
        model,
        # one word of the query, repeated in a short chunk
        IndexedDocument("one.txt", ["lease lease lease"], [v]),
        # two words of the query in a long chunk
        IndexedDocument("two.txt", ["lease renewal " + " ".join(f"w{i}" for i in range(60))], [v]),
        IndexedDocument(
            "all.txt", ["the lease renewal deadline, in a long sentence of words"], [v]
        ),
        IndexedDocument("none.txt", ["unrelated", "renewal renewal of everything"], [v, v]),
        # not served: counts in neither N, the average length nor a term's df
        IndexedDocument("gone.txt", ["deadline " * 40, "lease"], [v, v]),
    )
    with db.connection() as conn:
        conn.execute("DELETE FROM served_versions WHERE document_id = %s", (ids["gone.txt"],))
        served = [i for key, i in ids.items() if key != "gone.txt"]
        query = "lease renewal deadline"
        expected = _bm25_reference(conn, query, served)
        ranked = text_ranking(conn, model, query, 10)
        assert keys(ranked) == sorted(expected, key=lambda k: -expected[k])
        assert [r.score for r in ranked] == pytest.approx([expected[k] for k in keys(ranked)])
        # k1 and b are the caller's
        other = _bm25_reference(conn, query, served, k1=2.0, b=0.0)
        ranked = text_ranking(conn, model, query, 10, bm25=Bm25(k1=2.0, b=0.0))
        assert [r.score for r in ranked] == pytest.approx([other[k] for k in keys(ranked)])
        # the limit is reached inside the first tiers: the others are not read
        assert keys(text_ranking(conn, model, query, 1)) == [("all.txt", 0)]
        # a Korean word and its particle-less stem are one term, not two
        store(db, model, IndexedDocument("ko.txt", ["서울입니다 lease"], [v]))
        assert keys(text_ranking(conn, model, "서울에서 lease", 10))[0] == ("ko.txt", 0)
        # quotes and backslashes in a word are tsquery-quoted, not syntax
        assert text_ranking(conn, model, "o'neil \\ back\\slash '", 10) == []


def test_bm25_parameters_are_checked() -> None:
    assert Bm25() == Bm25(k1=1.2, b=0.75)  # Lucene's defaults
    for k1, b in [(-0.1, 0.5), (1.2, 1.5), (1.2, -0.1), (math.nan, 0.5)]:
        with pytest.raises(ValueError, match="BM25 needs"):
            Bm25(k1=k1, b=b)


def test_text_statistics_go_with_the_served_row(db: Database, model: EmbeddingModel) -> None:
    """The statistics are columns of the served row (the completion writes them:
    tests/db/test_group_commit.py): a served row deleted, or its document, takes them along."""
    v = unit(1, 0, 0, 0)
    ids = store(db, model, IndexedDocument("a.txt", ["abc", "defgh"], [v, v]))
    other = store(db, model, IndexedDocument("b.txt", ["xy"], [v]))

    def statistics(conn: Connection) -> list[tuple[str, int, int]]:
        rows = conn.execute(
            """SELECT d.external_key, s.chunks, s.text_length FROM served_versions s
               JOIN documents d ON d.id = s.document_id ORDER BY 1"""
        ).fetchall()
        return [(r["external_key"], r["chunks"], r["text_length"]) for r in rows]

    with db.connection() as conn:
        assert statistics(conn) == [("a.txt", 2, 8), ("b.txt", 1, 2)]
        assert term_statistics(conn, model, []).chunks == 3
        # read with a batch's terms: the same sums; without a model, none
        terms, collection = queries_terms_and_collection(conn, ["abc", "the"], model)
        assert collection == Collection(3, 10) and [len(t) for t in terms] == [1, 0]
        assert queries_terms_and_collection(conn, ["abc"], None)[1] is None
        assert queries_terms_and_collection(conn, [], model)[1] == Collection(3, 10)
        conn.execute("DELETE FROM served_versions WHERE document_id = %s", (ids["a.txt"],))
        assert statistics(conn) == [("b.txt", 1, 2)]
        conn.execute("DELETE FROM documents WHERE id = %s", (other["b.txt"],))
        assert statistics(conn) == []
        assert term_statistics(conn, model, []).chunks == 0


def test_every_chunk_holds_its_english_lexemes_once(db: Database, model: EmbeddingModel) -> None:
    store(db, model, IndexedDocument("a.txt", ["The workers 서울입니다"], [unit(1, 0, 0, 0)]))
    with db.connection() as conn:
        row = conn.execute("SELECT search_vector::text AS v FROM document_chunks").fetchone()
        index = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'document_chunks_search_vector'"
        ).fetchone()
    assert row is not None and index is not None
    # stems without stop words; a word the English stemmer does not know, as written: each at
    # its own position only, so a term's tf is its count in the text
    assert row["v"] == "'worker':2 '서울입니다':3"
    assert "USING gin (search_vector)" in index["indexdef"]


def test_a_common_terms_df_comes_from_analyze(
    db: Database, model: EmbeddingModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = unit(1, 0, 0, 0)
    texts = ["lease renewal"] * 6 + ["lease"] * 3 + ["deadline renewal of the lease"]
    store(db, model, *(IndexedDocument(f"{i}.txt", [t], [v]) for i, t in enumerate(texts)))
    with db.connection() as conn:
        exact = text_ranking(conn, model, "lease renewal deadline", 10)
        conn.execute("ANALYZE document_chunks")
        # every term past the exact count: ANALYZE's shares of the chunks (here: all of them)
        monkeypatch.setattr("trioindex.db.search.DF_EXACT_UP_TO", 0)
        forget()  # the collection did not change: its counted dfs are kept otherwise
        estimated = text_ranking(conn, model, "lease renewal deadline", 10)
    assert keys(estimated) == keys(exact)
    assert [r.score for r in estimated] == pytest.approx([r.score for r in exact], rel=1e-4)


def test_chunks_it_may_not_return_ranked_first_still_leave_the_list_full(
    db: Database, model: EmbeddingModel
) -> None:
    v = unit(1, 0, 0, 0)
    long = "the lease of a house, in a sentence long enough to rank below the short ones"
    ids = store(
        db,
        model,
        # ts_rank puts these short chunks first: none may be returned
        *(IndexedDocument(f"gone/{i}.txt", ["lease lease lease"], [v]) for i in range(5)),
        IndexedDocument("other/x.txt", ["lease lease"], [v]),
        IndexedDocument("keep/novec.txt", ["lease lease lease"], [v]),
        IndexedDocument("keep/a.txt", [long], [v]),
        IndexedDocument("keep/b.txt", [long + " again"], [v]),
    )
    with db.connection() as conn:
        for i in range(5):
            conn.execute(
                "DELETE FROM served_versions WHERE document_id = %s", (ids[f"gone/{i}.txt"],)
            )
        # a chunk without the model's vector is not in its chunk set
        conn.execute("DELETE FROM embeddings WHERE document_id = %s", (ids["keep/novec.txt"],))
        keep = Filters(key_prefix="keep/")
        assert keys(text_ranking(conn, model, "lease", 2, filters=keep)) == [
            ("keep/a.txt", 0),
            ("keep/b.txt", 0),
        ]
        assert {k for k, _ in keys(text_ranking(conn, model, "lease", 3))} == {
            "other/x.txt",
            "keep/a.txt",
            "keep/b.txt",
        }


def test_a_term_analyze_lists_as_common_takes_its_estimate_uncounted(
    db: Database, model: EmbeddingModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = unit(1, 0, 0, 0)
    store(db, model, *(IndexedDocument(f"{i}.txt", ["lease renewal"], [v]) for i in range(10)))
    with db.connection() as conn:
        conn.execute("ANALYZE document_chunks")
        # after ANALYZE: 10 chunks more without "lease"; its listed share (all chunks) is stale
        store(db, model, *(IndexedDocument(f"r{i}.txt", ["renewal"], [v]) for i in range(10)))
        counted = text_ranking(conn, model, "lease", 1)  # 10 <= 100 chunks: counted
        # ANALYZE's estimate, 20 chunks of 20, is past 12: taken as df without counting
        monkeypatch.setattr("trioindex.db.search.DF_EXACT_UP_TO", 12)
        forget()
        estimated = text_ranking(conn, model, "lease", 1)
    n = 20
    idf = [math.log(1 + (n - df + 0.5) / (df + 0.5)) for df in (10, 20)]
    assert keys(estimated) == keys(counted)
    assert estimated[0].score / counted[0].score == pytest.approx(idf[1] / idf[0])


def test_a_rare_terms_chunk_is_found_past_many_common_term_matches(
    db: Database, model: EmbeddingModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = unit(1, 0, 0, 0)
    # 60 chunks hold two of the query's three words; one long chunk holds only the rare one
    common = [IndexedDocument(f"c{i}.txt", [f"lease renewal note {i}"], [v]) for i in range(60)]
    rare = IndexedDocument("rare.txt", ["deadline " + " ".join(f"w{i}" for i in range(30))], [v])
    store(db, model, *common, rare)
    # "lease" and "renewal" are past the budget: common; "deadline" (df 1) is read in full
    monkeypatch.setattr("trioindex.search.ranking.RARE_POSTINGS", 10)
    with db.connection() as conn:
        query = "lease renewal deadline"
        ranked = text_ranking(conn, model, query, 5)
        served = [r["id"] for r in conn.execute("SELECT id FROM documents").fetchall()]
        expected = _bm25_reference(conn, query, served)
    # BM25 puts it first: a term in 1 of 61 chunks outweighs two in 60 of 61; a ranking that
    # took its candidates by how many terms they hold would fill the list before reaching it
    assert keys(ranked)[0] == ("rare.txt", 0)
    best = sorted(expected, key=lambda k: (-expected[k], k))[:5]
    assert [expected[k] for k in keys(ranked)] == pytest.approx([expected[k] for k in best])


def test_term_statistics_stay_exact_after_deletes(db: Database, model: EmbeddingModel) -> None:
    v = unit(1, 0, 0, 0)
    texts = ["lease renewal", "lease", "renewal of a lease, long", "unrelated words"]
    ids = store(db, model, *(IndexedDocument(f"{i}.txt", [t], [v]) for i, t in enumerate(texts)))
    with db.connection() as conn:
        terms = query_terms(conn, "lease renewal")
        before = term_statistics(conn, model, terms)  # kept for this collection
        assert (before.chunks, before.document_frequencies) == (4, (3.0, 2.0))
        conn.execute("DELETE FROM documents WHERE id = %s", (ids["0.txt"],))
        after = term_statistics(conn, model, terms)
        assert (after.chunks, after.document_frequencies) == (3, (2.0, 1.0))
        assert after.average_length == pytest.approx(sum(map(len, texts[1:])) / 3)
        # the ranking scores with them: as computed from the stored chunks
        served = [i for key, i in ids.items() if key != "0.txt"]
        expected = _bm25_reference(conn, "lease renewal", served)
        ranked = text_ranking(conn, model, "lease renewal", 10)
    assert {k: r.score for k, r in zip(keys(ranked), ranked, strict=True)} == pytest.approx(
        expected
    )


def test_vector_counts_read_quoted_lexemes_and_positions() -> None:
    assert vector_counts("'a':1,4A 'o''neil':2 'back\\\\slash':3 'bare'") == {
        "a": 2,
        "o'neil": 1,
        "back\\slash": 1,
        "bare": 1,
    }


def test_candidates_come_from_the_rarest_terms_then_the_others_rarest_pairs_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trioindex.search.ranking.RARE_POSTINGS", 100)
    terms = [TextTerm(f"'{t}'", t) for t in ("a", "b", "c", "d", "e")]
    budget = PAIR_CANDIDATES_PER_RESULT * 10
    branches, fill = candidate_branches(terms, [500, 40, 50, 900, 2], 10)
    assert branches == [
        CandidateBranch("'e' | 'b' | 'c'"),
        CandidateBranch("('a' & 'd')", budget),
    ]
    assert fill == CandidateBranch("'a' | 'd'", COMMON_CAP)
    # three common terms: those holding all three first, then the pairs, the rarest first
    branches, fill = candidate_branches(terms[:4], [500, 40, 700, 900], 10)
    assert branches == [
        CandidateBranch("'b'"),
        CandidateBranch("'a' & 'c' & 'd'", COMMON_CAP),
        CandidateBranch("('a' & 'c')", budget, ("('a' & 'd')", "('c' & 'd')")),
    ]
    # four: every chunk holding three of them too (they outscore most pairs)
    branches, _ = candidate_branches(terms[:4], [500, 400, 700, 900], 10)
    assert branches[:2] == [
        CandidateBranch("'b' & 'a' & 'c' & 'd'", COMMON_CAP),
        CandidateBranch(
            "('b' & 'a' & 'c') | ('b' & 'a' & 'd') | ('b' & 'c' & 'd') | ('a' & 'c' & 'd')",
            COMMON_CAP,
        ),
    ]
    assert branches[2].query == "('b' & 'a')" and branches[2].cap == budget
    # many common terms: no triples, the pairs in one index pass
    many = [TextTerm(f"'t{i}'", f"t{i}") for i in range(MANY_COMMON_TERMS + 1)]
    branches, _ = candidate_branches(many, [1000.0 + i for i in range(len(many))], 10)
    assert [b.then for b in branches] == [(), ()] and branches[1].query.count("|") == 35
    # every term rare: every chunk holding one is a candidate, no fill
    branches, fill = candidate_branches(terms[:4], [1, 2, 3, 4], 10)
    assert branches == [CandidateBranch("'a' | 'b' | 'c' | 'd'")] and fill is None


def test_the_pair_budget_reads_the_rarest_pairs_holders_first(
    db: Database, model: EmbeddingModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = unit(1, 0, 0, 0)
    # "lease renewal" (the commonest pair) in 40 chunks, "deadline renewal" (the rarest) in 3
    # and "deadline lease" in 2 long ones: the five holding "deadline" are BM25's best
    docs = [IndexedDocument(f"c{i}.txt", [f"lease renewal note {i}"], [v]) for i in range(40)]
    docs += [IndexedDocument(f"r{i}.txt", [f"deadline renewal memo {i}"], [v]) for i in range(3)]
    long = "deadline lease " + " ".join(f"w{i}" for i in range(12))
    docs += [IndexedDocument(f"best{i}.txt", [f"{long} {i}"], [v]) for i in range(2)]
    docs += [IndexedDocument(f"o{i}.txt", [f"lease only {i}"], [v]) for i in range(30)]
    store(db, model, *docs)
    monkeypatch.setattr("trioindex.search.ranking.RARE_POSTINGS", 0)  # every term is common
    monkeypatch.setattr("trioindex.search.ranking.PAIR_CANDIDATES_PER_RESULT", 1)
    with db.connection() as conn:
        query = "lease renewal deadline"
        terms = query_terms(conn, query)
        dfs = term_statistics(conn, model, terms).document_frequencies
        branches, _ = candidate_branches(terms, dfs, 5)
        candidates = db_search.candidate_vectors(conn, branches, None)
        ranked = text_ranking(conn, model, query, 5)
        served = [r["id"] for r in conn.execute("SELECT id FROM documents").fetchall()]
        expected = _bm25_reference(conn, query, served)
    # the budget (5 chunks) is filled by the rarest pair's 3 holders, then the next pair's 2:
    # the 40 holding the commonest pair are not read
    assert len(candidates) == 5
    assert sorted(k for k, _ in keys(ranked)) == [
        "best0.txt",
        "best1.txt",
        "r0.txt",
        "r1.txt",
        "r2.txt",
    ]
    best = sorted(expected, key=lambda k: (-expected[k], k))[:5]
    assert [expected[k] for k in keys(ranked)] == pytest.approx([expected[k] for k in best])
