"""Documents with each model's state (db/operations.py list_documents / show_document) on a
real PostgreSQL: pages in key order under a prefix, the newest version's jobs per model, and
every version of one document."""

from __future__ import annotations

import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.operations.document_views import list_documents, show_document
from trioindex.db.pool import Database
from trioindex.errors import NotFound
from trioindex.values import JobStatus


def test_documents_page_by_key_under_a_prefix(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        for key in ("a/1", "a/2", "a/3", "b/1"):
            helpers.enqueue(conn, model.id, key)
        first = list_documents(conn, prefix="a/", limit=2)
        assert [d.key for d in first.documents] == ["a/1", "a/2"]
        assert first.next_after == "a/2"
        rest = list_documents(conn, prefix="a/", after=first.next_after, limit=2)
        assert [d.key for d in rest.documents] == ["a/3"] and rest.next_after is None
        (doc,) = rest.documents
        (latest,) = doc.versions
        (state,) = latest.models
        assert (state.model, state.serves_search, state.job_status) == (
            model.name,
            True,
            JobStatus.PENDING,
        )
        assert state.served_version_no is None
        assert list_documents(conn, prefix="nothing/").documents == ()


def test_a_document_shows_every_version_and_the_version_its_model_serves(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        worker = helpers.worker(conn)
        helpers.enqueue(conn, model.id, "doc", content=b"one")
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        helpers.stage_embedded(conn, claim)
        lifecycle.complete_job(conn, claim)
        helpers.enqueue(conn, model.id, "doc", content=b"two")
        doc = show_document(conn, "doc")
        assert doc.version_count == 2
        assert [v.version_no for v in doc.versions] == [1, 2]
        first, second = (v.models[0] for v in doc.versions)
        assert (first.job_status, first.chunk_count, first.served_version_no) == (
            JobStatus.SUCCEEDED,
            2,
            1,
        )
        assert (second.job_status, second.served_version_no) == (JobStatus.PENDING, 1)
        listed = list_documents(conn).documents[0]
        assert listed.version_count == 2 and listed.versions[0].version_no == 2
        with pytest.raises(NotFound):
            show_document(conn, "absent")
