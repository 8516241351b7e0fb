"""The chaos run (testkit/chaos/): its checks catch violations, and a very short run passes.

The real chaos run is ``just chaos`` (two minutes of faults, three times for the report). Here:

* fast tests feed the checks hand-made evidence with one violation each, so a passing chaos run
  means something: every check used below can fail;
* one slow test runs 18 seconds of the same chaos (real workers, kill -9, both outages, faulty
  embedding server) over 30 documents in three ingest waves, with invalid vectors five times
  as frequent and embedding faults kept on while the queue drains (on a busy machine little
  may be embedded in 18 seconds), and asserts every invariant check passed.
  ``faults_exercised`` is left out: 18 seconds are too short for the storage outage to be sure
  to meet a backlog of jobs (the full run asserts it).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from testkit import chaos
from testkit.embed_server import ServerStats

MODEL = uuid4()


def _job(key: str, status: str, **extra: Any) -> dict[str, Any]:
    """A job row as ``Stored.load`` reads it: version 1 of ``key`` for the serving model, one
    chunk; a SUCCEEDED job has its vector and its model serves the version."""
    version = uuid4()
    succeeded = status == "SUCCEEDED"
    row: dict[str, Any] = {
        "external_key": key,
        "job_id": uuid4(),
        "version_id": version,
        "version_no": 1,
        "model_id": MODEL,
        "serving": True,
        "status": status,
        "chunk_count": 1 if succeeded else None,
        "attempt_count": 1,
        "max_attempts": 25,
        "last_failure_type": None,
        "lease_expired": False,
        "served_version_id": version if succeeded else None,
        "served_version_no": 1 if succeeded else None,
        "chunks": 1,
        "distinct_indexes": 1,
        "max_index": 0,
        "vectors": 1 if succeeded else 0,
        "all_vectors": 1 if succeeded else 0,
    }
    row.update(extra)
    return row


def _stored(
    jobs: list[dict[str, Any]],
    attempts: dict[UUID, list[dict[str, Any]]] | None = None,
    *,
    tokens: set[str] | None = None,
    texts: dict[str, set[str]] | None = None,
) -> chaos.Stored:
    if attempts is None:
        attempts = {
            job["job_id"]: [
                {
                    "attempt_no": 1,
                    "status": "SUCCEEDED" if job["status"] == "SUCCEEDED" else "FAILED",
                    "failure_type": job["last_failure_type"],
                }
            ]
            for job in jobs
        }
    return chaos.Stored(
        url="postgresql://unused",
        jobs=jobs,
        attempts=attempts,
        keys_of_text=texts or {},
        tokens=tokens or set(),
        events=Counter(),
        retries_by_type=Counter(),
    )


def _seen(
    tmp_path: Path,
    corpus: list[chaos.CorpusFile],
    *,
    faults: list[chaos.VectorFault] | None = None,
) -> chaos.Observed:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    fleet = chaos.Fleet(env={}, logs=logs, clock=time.monotonic)
    return chaos.Observed(
        corpus=corpus,
        tag="beef",
        secret="s3-secret-for-the-test",
        logs=logs,
        fleet=fleet,
        exits=[],
        unregistered=[],
        ingestor=chaos.Ingestor(env={}, logs=logs, pending=[]),
        drained=True,
        vector_faults=faults or [],
        server=ServerStats(
            requests=0,
            info_requests=0,
            embed_requests=0,
            inputs=0,
            batch_sizes=(),
            max_concurrent=0,
            faults={},
            last_authorization=None,
            last_payload=None,
            too_long=0,
        ),
        fault_rates={},
        outages=[],
        storage_resets=0,
    )


def _outcomes(seen: chaos.Observed, db: chaos.Stored) -> chaos.Check:
    faulted, unattributed = chaos.faulted_documents(seen, db)
    check, _, _ = chaos.check_outcomes(seen, db, faulted, unattributed)
    return check


def test_outcomes_accept_the_expected_failure_types(tmp_path: Path) -> None:
    corpus = [
        chaos.CorpusFile("a.txt", 0, "txt"),
        chaos.CorpusFile("b.txt", 0, "txt"),
        chaos.CorpusFile("c.pdf", 0, "binary-pdf"),
    ]
    jobs = [
        _job("a.txt", "SUCCEEDED"),
        _job("b.txt", "FAILED", last_failure_type="EMBEDDING_RESULT_INVALID"),
        _job("c.pdf", "FAILED", last_failure_type="DOCUMENT_CONTENT_INVALID"),
    ]
    fault = chaos.VectorFault(0.0, "nan", ("text of b",))
    db = _stored(jobs, texts={"text of b": {"b.txt"}})
    assert _outcomes(_seen(tmp_path, corpus, faults=[fault]), db).ok


@pytest.mark.parametrize(
    ("kind", "job", "why"),
    [
        (
            "txt",
            _job("x", "FAILED", last_failure_type="EMBEDDING_RESULT_INVALID"),
            "without any invalid vector",
        ),
        (
            "txt",
            _job("x", "FAILED", last_failure_type="EMBEDDING_PROVIDER_UNAVAILABLE"),
            "FAILED EMBEDDING_PROVIDER_UNAVAILABLE",
        ),
        ("empty", _job("x", "SUCCEEDED"), "x (empty): SUCCEEDED"),
        ("txt", _job("x", "SUCCEEDED", attempt_count=25), "used all 25 attempts"),
        (
            "txt",
            _job("x", "SUCCEEDED", served_version_id=None, served_version_no=None),
            "its model does not serve the version",
        ),
        ("txt", _job("x", "SUCCEEDED", serving=False), "a model that does not serve search"),
    ],
)
def test_outcomes_reject_a_wrong_end_state(
    tmp_path: Path, kind: str, job: dict[str, Any], why: str
) -> None:
    check = _outcomes(_seen(tmp_path, [chaos.CorpusFile("x", 0, kind)]), _stored([job]))
    assert not check.ok
    assert why in check.detail


def test_an_invalid_vector_absorbed_within_the_attempt_counts_as_absorbed(tmp_path: Path) -> None:
    # The worker's coalescer sends a job's texts again alone when a request shared with other
    # jobs got an invalid vector, so the attempt that saw it may still index the document; what
    # was stored is checked on its own (check_embeddings: finite, right dimension, expected).
    seen = _seen(
        tmp_path,
        [chaos.CorpusFile("x", 0, "txt")],
        faults=[chaos.VectorFault(0.0, "wrong_dimension", ("t",))],
    )
    db = _stored([_job("x", "SUCCEEDED")], texts={"t": {"x"}})
    faulted, unattributed = chaos.faulted_documents(seen, db)
    check, _, absorbed = chaos.check_outcomes(seen, db, faulted, unattributed)
    assert check.ok and absorbed == 1


def test_attempts_must_be_numbered_without_gaps() -> None:
    job = _job("x", "SUCCEEDED", attempt_count=3)
    rows = [
        {"attempt_no": 1, "status": "EXPIRED", "failure_type": None},
        {"attempt_no": 3, "status": "SUCCEEDED", "failure_type": None},
    ]
    check = chaos.check_attempts(_stored([job], {job["job_id"]: rows}))
    assert not check.ok and "attempts [1, 3]" in check.detail
    rows.insert(1, {"attempt_no": 2, "status": "FAILED", "failure_type": "STORAGE_UNAVAILABLE"})
    assert chaos.check_attempts(_stored([job], {job["job_id"]: rows})).ok


def test_embeddings_must_match_chunks() -> None:
    assert chaos.check_embeddings_per_job(_stored([_job("x", "SUCCEEDED")])).ok
    short = _job("x", "SUCCEEDED", chunks=3, chunk_count=3, max_index=2, distinct_indexes=3)
    check = chaos.check_embeddings_per_job(_stored([short]))
    assert not check.ok and "1 embeddings (1 on the version), 3 chunks" in check.detail
    # the job's chunk_count is the set it indexed: it must agree with the set and its vectors
    miscounted = _job("x", "SUCCEEDED", chunk_count=2)
    check = chaos.check_embeddings_per_job(_stored([miscounted]))
    assert not check.ok and "chunk_count 2" in check.detail


def test_a_failed_job_has_no_vectors_and_is_not_served() -> None:
    assert chaos.check_embeddings_per_job(_stored([_job("x", "FAILED")])).ok
    with_vectors = _job("x", "FAILED", vectors=1, all_vectors=1)
    check = chaos.check_embeddings_per_job(_stored([with_vectors]))
    assert not check.ok and "FAILED with 1 embeddings of its model" in check.detail
    served = _job("x", "FAILED", served_version_no=1)
    served["served_version_id"] = served["version_id"]
    check = chaos.check_embeddings_per_job(_stored([served]))
    assert not check.ok and "FAILED yet its model serves the version" in check.detail


def test_a_failed_job_is_its_own_models_alone() -> None:
    """One version, two models: model A's job FAILED, model B's SUCCEEDED and served. A
    failure is per job (no version-wide FAILED), so the checks accept B as it is."""
    b = _job("x", "SUCCEEDED", model_id=uuid4(), serving=False)
    a = _job(
        "x",
        "FAILED",
        version_id=b["version_id"],
        last_failure_type="EMBEDDING_RESULT_INVALID",
    )
    db = _stored([a, b])
    assert chaos.check_embeddings_per_job(db).ok
    assert chaos.check_served_forward(db).ok
    # and B is still judged on its own: a missing vector of B's is caught
    db = _stored([a, {**b, "vectors": 0, "all_vectors": 0}])
    assert not chaos.check_embeddings_per_job(db).ok


def _versions(served_no: int | None, *statuses: str) -> list[dict[str, Any]]:
    """Versions 1..n of document x for one model, with these job statuses, the model serving
    version ``served_no`` (None: nothing)."""
    jobs = [_job("x", status, version_no=n) for n, status in enumerate(statuses, 1)]
    served = next((j["version_id"] for j in jobs if j["version_no"] == served_no), None)
    for job in jobs:
        job["served_version_id"], job["served_version_no"] = served, served_no
    return jobs


@pytest.mark.parametrize(
    ("served_no", "statuses", "why"),
    [
        (2, ("SUCCEEDED", "SUCCEEDED"), None),
        (1, ("SUCCEEDED", "FAILED"), None),  # version 2 failed: version 1 stays served
        (1, ("SUCCEEDED", "SUCCEEDED"), "serves version 1, not version 2"),  # backwards
        (2, ("SUCCEEDED", "FAILED"), "serves version 2, not version 1"),  # never completed
        (None, ("SUCCEEDED",), "serves version None, not version 1"),
        (1, ("FAILED",), "serves version 1, which no job of its model completed"),
    ],
)
def test_the_served_version_is_the_newest_its_model_completed(
    served_no: int | None, statuses: tuple[str, ...], why: str | None
) -> None:
    check = chaos.check_served_forward(_stored(_versions(served_no, *statuses)))
    if why is None:
        assert check.ok, check.detail
    else:
        assert not check.ok and why in check.detail


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("claimed with token 3f2a9c1e5b7d4e8fa0b1c2d3e4f5a6b7", "claim token"),
        ("claimed with token 3f2a9c1e-5b7d-4e8f-a0b1-c2d3e4f5a6b7", "claim token"),
        ("parsed: The quick brown fox jumps over the lazy dog while the chaos run", "text of 1"),
        ("sent cxmbeefd0001s002 to the server", "corpus marker"),
        ("connecting with s3-secret-for-the-test", "S3 secret"),
    ],
)
def test_logs_must_not_hold_secrets_or_text(tmp_path: Path, line: str, why: str) -> None:
    token = "3f2a9c1e-5b7d-4e8f-a0b1-c2d3e4f5a6b7"
    text = "The quick brown fox jumps over the lazy dog while the chaos run goes on."
    seen = _seen(tmp_path, [])
    db = _stored([], tokens={token}, texts={text: {"x"}})
    (seen.logs / "worker-001.log").write_text("12:00:00 INFO worker registered\n")
    (clean, _), _ = chaos.check_logs(seen, db)
    assert clean.ok, clean.detail
    (seen.logs / "worker-002.log").write_text(line + "\n")
    (clean, _), _ = chaos.check_logs(seen, db)
    assert not clean.ok and why in clean.detail


def test_a_traceback_in_any_log_fails(tmp_path: Path) -> None:
    seen = _seen(tmp_path, [])
    db = _stored([], tokens={str(uuid4())})
    (seen.logs / "ingest-1-1.log").write_text("Traceback (most recent call last):\n  boom\n")
    (_, tracebacks), _ = chaos.check_logs(seen, db)
    assert not tracebacks.ok and "ingest-1-1.log" in tracebacks.detail


@pytest.mark.slow
def test_a_short_chaos_run_keeps_every_invariant() -> None:
    options = chaos.Options(
        duration=18,
        documents=30,
        waves=(0.0, 0.25, 0.5),
        faults_in_drain=True,
        seed=7,
        drain_timeout=60,
        fault_rates={**chaos.FAULT_RATES, "nan": 0.05, "wrong_dimension": 0.05},
    )
    folder = chaos.new_run_folder()
    result = chaos.run_once(options, 1, folder, "pytest tests/test_chaos_smoke.py")
    failed = {c.name: c.detail for c in result.checks if not c.ok and c.name != "faults_exercised"}
    if not failed:
        shutil.rmtree(folder, ignore_errors=True)
    assert not failed, f"{failed}; logs kept in {folder}"
    counts = result.counts
    assert counts["kills"] >= 1
    assert counts["faults_injected_total"] >= 1
    assert set(counts["outages"]) == {"storage", "postgresql"}
    assert counts["outcomes"]["FAILED DOCUMENT_CONTENT_INVALID"] == counts["invalid_documents"]
    assert counts["outcomes"]["SUCCEEDED"] >= 1


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/embed", {"inputs": ["first", "second"], "truncate": False, "normalize": True}),
        ("/v1/embeddings", {"input": ["first", "second"], "encoding_format": "base64"}),
    ],
    ids=["tei /embed", "tei and openai /v1/embeddings"],
)
def test_the_recording_server_names_the_texts_of_an_invalid_answer_on_every_route(
    route: str, body: dict[str, Any]
) -> None:
    """The chaos run's invariants about invalid vectors hold only if every such answer is
    attributed to its texts, whichever route the client asked."""
    import httpx

    from testkit.chaos.faults import RecordingEmbedServer

    with RecordingEmbedServer(dimension=4, fault_rates={"nan": 1.0}) as server:
        answer = httpx.post(f"{server.url}{route}", json=body, timeout=10)
        faults = server.vector_faults()
    assert answer.status_code == 200
    assert [(fault.kind, fault.texts) for fault in faults] == [("nan", ("first", "second"))]
