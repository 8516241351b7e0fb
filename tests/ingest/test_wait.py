"""``ingest --wait`` (``progress.wait_for_jobs``) on real PostgreSQL: it ends when every job it
waits for has finished or was removed with its document."""

from __future__ import annotations

import trio

from tests import helpers
from trioindex.db.documents import delete_documents
from trioindex.db.pool import Database
from trioindex.progress import wait_for_jobs


async def test_a_wait_ends_when_a_waited_for_document_is_deleted_and_says_so(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        kept = helpers.enqueue(conn, model.id, "kept.txt")
        gone = helpers.enqueue(conn, model.id, "gone.txt")
        conn.execute(
            """UPDATE embedding_jobs SET status = 'FAILED', finished_at = now(),
                   last_failure_type = 'DOCUMENT_CONTENT_INVALID' WHERE id = %s""",
            (kept.job_id,),
        )
        delete_documents(conn, ["gone.txt"])
    assert kept.job_id is not None and gone.job_id is not None
    with trio.fail_after(10):  # it used to wait for ever for the deleted job's row
        waited = await wait_for_jobs(db, [kept.job_id, gone.job_id], show=False)
    assert [(r["id"], r["status"]) for r in waited.finals] == [(kept.job_id, "FAILED")]
    assert waited.removed == {gone.job_id}
