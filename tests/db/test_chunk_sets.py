"""Chunk sets on a real PostgreSQL (migration 0008): a version keeps one set of chunks per
chunking, so a model whose chunking differs (token-aware chunks cut with its own tokenizer)
chunks the version again for itself, beside the set the serving model ranks, and search ranks
each model's own set only."""

from __future__ import annotations

import hashlib
from uuid import UUID

import numpy as np
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, activate_model, remove_model, serving_model
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import (
    ChunkCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    begin_embedding,
    store_chunks_many,
    store_embeddings_many,
)
from trioindex.errors import StateInconsistent
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.pipeline.embed_step import drafts_from_matrix
from trioindex.search.ranking import text_ranking
from trioindex.values import Claim, token_chunking
from trioindex.worker.job import steps_for

OLD, NEW = "old-model", "new-model"
TOKENS = token_chunking(NEW)
TEXT = "alpha bravo charlie delta echo foxtrot"


def _drafts(texts: list[str]) -> list[ChunkDraft]:
    drafts, start = [], 0
    for index, text in enumerate(texts):
        drafts.append(
            ChunkDraft(
                index=index,
                text=text,
                start=start,
                end=start + len(text),
                token_count=len(text.split()),
                content_sha256=hashlib.sha256(text.encode()).hexdigest(),
            )
        )
        start += len(text)
    return drafts


def _parse(conn: Connection, claim: Claim, texts: list[str]) -> EmbedSnapshot | int | Exception:
    """The parse step's transaction for ``claim``, the file's text given as ``texts``."""
    assert claim.parse is not None  # the claim carries what the parse reads
    with conn.transaction():
        (result,) = store_chunks_many(conn, [ChunkCommit(claim, claim.parse, _drafts(texts))])
    return result


def _embed_and_complete(conn: Connection, claim: Claim, value: float = 1.0) -> None:
    snapshot = begin_embedding(conn, claim)
    matrix = np.full((len(snapshot.chunks), snapshot.dimension), value, dtype=np.float32)
    with conn.transaction():
        (result,) = store_embeddings_many(
            conn, [EmbeddingCommit(claim, snapshot, drafts_from_matrix(snapshot, matrix))]
        )
    assert not isinstance(result, Exception), result


def _sets(conn: Connection, version: UUID) -> dict[str, list[str]]:
    rows = conn.execute(
        """SELECT chunking, content FROM document_chunks WHERE document_version_id = %s
           ORDER BY chunking, chunk_index""",
        (version,),
    ).fetchall()
    sets: dict[str, list[str]] = {}
    for row in rows:
        sets.setdefault(row["chunking"], []).append(row["content"])
    return sets


def _vector_sets(conn: Connection, model: EmbeddingModel) -> set[str]:
    """The chunk sets ``model``'s vectors point at."""
    rows = conn.execute(
        """SELECT DISTINCT c.chunking FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
           WHERE e.embedding_model_id = %s""",
        (model.id,),
    ).fetchall()
    return {r["chunking"] for r in rows}


@pytest.fixture
def indexed(db: Database) -> tuple[EmbeddingModel, Claim]:
    """One document INDEXED for the old model from a character chunk set of three chunks."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        worker = helpers.worker(conn)
        helpers.enqueue(conn, old.id, "doc.txt", content=TEXT.encode())
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=old.id)
        assert (claim.chunking, claim.chunks_ready) == ("characters", False)
        assert _parse(conn, claim, ["alpha bravo", "charlie delta", "echo foxtrot"])
        _embed_and_complete(conn, claim)
    return old, claim


def test_a_token_aware_model_chunks_an_indexed_version_again_beside_the_served_set(
    db: Database, indexed: tuple[EmbeddingModel, Claim]
) -> None:
    old, first = indexed
    version = first.document_version_id
    with db.connection() as conn:
        before = _sets(conn, version)
        new = activate_model(conn, NEW, 4, max_attempts=3).model
        tokens_worker = helpers.worker(conn, chunking=TOKENS)
        (claim,) = lifecycle.claim_jobs(conn, tokens_worker, 1, 300, model_id=new.id)
        # the old model serves the version, but not in this worker's chunking: it parses again
        assert (claim.chunking, claim.chunks_ready) == (TOKENS, False)
        assert steps_for(chunks_ready=claim.chunks_ready)[0] == "parse"
        result = _parse(conn, claim, ["alpha bravo charlie", "delta echo foxtrot"])
        assert isinstance(result, EmbedSnapshot) and len(result.chunks) == 2
        # a replay of the same commit converges: nothing written twice
        stored = helpers.count(conn, "SELECT count(*) FROM document_chunks")
        assert _parse(conn, claim, ["alpha bravo charlie", "delta echo foxtrot"]) == 2
        assert helpers.count(conn, "SELECT count(*) FROM document_chunks") == stored
        assert helpers.job_row(conn, first.job_id)["chunk_count"] == 3  # what the old one serves
        # the old model still ranks its own set, and only it, while the new set is embedded
        assert [r.chunk_index for r in text_ranking(conn, old, "alpha", 10)] == [0]
        _embed_and_complete(conn, claim, value=0.5)

        sets = _sets(conn, version)
        assert sets["characters"] == before["characters"]  # the served set was not touched
        assert sets[TOKENS] == ["alpha bravo charlie", "delta echo foxtrot"]
        assert _vector_sets(conn, old) == {"characters"}
        assert _vector_sets(conn, new) == {TOKENS}
        assert serving_model(conn) == EmbeddingModel(new.id, NEW, 4, True)
        ranked = text_ranking(conn, new, "delta", 10)
        assert [(r.chunk_index, r.document_key) for r in ranked] == [(1, "doc.txt")]

        # removing the old model leaves the character set (any model may share it); removing
        # a token-aware model takes its own set with it
        activate_model(conn, OLD, 4, max_attempts=3)
        assert remove_model(conn, NEW).chunks == 2
        assert set(_sets(conn, version)) == {"characters"}


def test_a_model_with_the_same_chunking_embeds_the_stored_set_without_parsing(
    db: Database, indexed: tuple[EmbeddingModel, Claim]
) -> None:
    _, first = indexed
    with db.connection() as conn:
        new = activate_model(conn, NEW, 4, max_attempts=3).model
        (claim,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300, model_id=new.id)
        assert (claim.chunking, claim.chunks_ready) == ("characters", True)
        assert steps_for(chunks_ready=claim.chunks_ready)[0] == "embed"
        _embed_and_complete(conn, claim)
        assert set(_sets(conn, first.document_version_id)) == {"characters"}
        assert _vector_sets(conn, new) == {"characters"}


@pytest.mark.parametrize("first", ["characters", TOKENS])
def test_twin_jobs_of_a_switch_each_store_their_own_set_in_either_order(
    db: Database, indexed: tuple[EmbeddingModel, Claim], first: str
) -> None:
    old, _ = indexed
    with db.connection() as conn:
        new = activate_model(conn, NEW, 4, max_attempts=3).model
        # a new file during the switch: one job per model (the follow_models trigger's twin), claimed
        # before the activation's own job by its priority
        helpers.enqueue(conn, old.id, "new.txt", content=b"golf hotel india", priority=10)
        workers = {
            "characters": helpers.worker(conn),
            TOKENS: helpers.worker(conn, chunking=TOKENS),
        }
        models = {"characters": old, TOKENS: new}
        claims = {
            label: lifecycle.claim_jobs(conn, workers[label], 1, 300, model_id=models[label].id)[0]
            for label in ("characters", TOKENS)
        }
        for claim in claims.values():
            assert not claim.chunks_ready and claim.parse is not None
        texts = {"characters": ["golf hotel", "india"], TOKENS: ["golf hotel india"]}
        second = TOKENS if first == "characters" else "characters"
        for label in (first, second):
            result = _parse(conn, claims[label], texts[label])
            assert isinstance(result, EmbedSnapshot), result
            assert [c.text for c in result.chunks] == texts[label]
        for label in (first, second):
            _embed_and_complete(conn, claims[label])
        version = claims[first].document_version_id
        assert _sets(conn, version) == texts
        for label, claim in claims.items():
            row = helpers.job_row(conn, claim.job_id)
            assert (row["status"], row["chunk_count"]) == ("SUCCEEDED", len(texts[label]))


def test_vectors_for_another_set_are_refused(
    db: Database, indexed: tuple[EmbeddingModel, Claim]
) -> None:
    # a token-aware job handed the character set's chunk ids (as if it embedded the wrong set)
    _, first = indexed
    with db.connection() as conn:
        new = activate_model(conn, NEW, 4, max_attempts=3).model
        tokens_worker = helpers.worker(conn, chunking=TOKENS)
        (claim,) = lifecycle.claim_jobs(conn, tokens_worker, 1, 300, model_id=new.id)
        with pytest.raises(StateInconsistent, match="no chunks"):
            begin_embedding(conn, claim)  # its set does not exist yet
        assert _parse(conn, claim, ["alpha bravo charlie delta echo foxtrot"])
        snapshot = begin_embedding(conn, claim)
        ids = conn.execute(
            """SELECT id FROM document_chunks WHERE document_version_id = %s
               AND chunking = 'characters' ORDER BY chunk_index LIMIT 1""",
            (first.document_version_id,),
        ).fetchall()
        wrong = EmbedSnapshot(
            snapshot.version_id,
            snapshot.document_id,
            snapshot.model_id,
            snapshot.model_name,
            snapshot.dimension,
            tuple(type(c)(ids[0]["id"], c.index, c.text) for c in snapshot.chunks),
            complete=False,
        )
        matrix = np.ones((1, 4), dtype=np.float32)
        with conn.transaction():
            (result,) = store_embeddings_many(
                conn, [EmbeddingCommit(claim, wrong, drafts_from_matrix(wrong, matrix))]
            )
        assert isinstance(result, StateInconsistent) and "chunks changed" in str(result)
        assert _vector_sets(conn, new) == set()
