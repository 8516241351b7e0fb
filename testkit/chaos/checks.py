"""The chaos checks on the database and on the run (see :data:`CHECKS` for what each
asserts), and :func:`run_checks`, which runs them all and counts what happened."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from testkit.chaos.evidence import Check, Observed, Stored, check
from testkit.chaos.logscan import check_logs, worker_warnings
from testkit.chaos.plan import DIMENSION, OUTAGE_SLACK, OUTAGES
from testkit.embed_server import VECTOR_FAULTS, fake_vector
from testkit.processes import query
from trioindex.db.pool import connect
from trioindex.embedding.vectors import vector_sha256

#: What each check asserts, for the report.
CHECKS: dict[str, str] = {
    "drained": "every file ingested once; with recovery allowed to finish, no job is PENDING or "
    "PROCESSING (bounded wait)",
    "outcomes": "every valid document's job SUCCEEDED, its version served by the serving model "
    "(served_versions), unless one of its embedding requests got a NaN / wrong-dimension "
    "answer, then FAILED EMBEDDING_RESULT_INVALID or SUCCEEDED all the same (a later attempt, "
    "or its texts sent again alone); every invalid file FAILED DOCUMENT_CONTENT_INVALID; no "
    "other failure type; no job ran out of attempts",
    "embeddings_per_job": "every SUCCEEDED job: its model's vectors = the chunks of its chunk "
    "set = its chunk_count >= 1, chunk indexes 0..n-1; every FAILED job: none of its model's "
    "vectors on its version (every chaos document fits one slice of vectors, so a failed "
    "attempt leaves no partial set) and its model does not serve it (a failure is the job's "
    "alone: other models' jobs of the version are judged on their own rows)",
    "served_forward": "each model serves, per document, the newest version it completed (no "
    "served version moves backwards, none is served before its job completed)",
    "no_duplicates": "no (chunk, model) pair has two embeddings",
    "vectors_intact": "every stored vector is the server's vector for its chunk's text "
    "(finite, 1024 dims), its SHA-256 matches and its denormalised ids match the chunk",
    "no_processing_past_lease": "no job PROCESSING past its lease, none PROCESSING at all and "
    "no attempt STARTED once drained",
    "attempts_consecutive": "each job's attempt numbers are exactly 1..attempt_count; only the "
    "last can be SUCCEEDED (or the FAILED that ended it), the others FAILED, EXPIRED or "
    "CANCELLED (handed back at shutdown)",
    "logs_clean": "no claim token (any of those the database handed out), chunk text, corpus "
    "marker word, S3 secret or embedding-server error body in any log the product wrote",
    "no_tracebacks": "no Python traceback in any log the product wrote",
    "workers_survived": "no worker exited on its own, except failing fast at start while a "
    "dependency was down; every worker exited 0 on SIGTERM within the grace period, row STOPPED",
    "faults_exercised": "the run did what it claims: kills, every kind of embedding fault "
    "expected 8+ times, at least one invalid vector, "
    "attempts failed by the storage outage, the database restart, lease recoveries and retries "
    "all happened",
}


def check_drained(seen: Observed, db: Stored) -> Check:
    problems = []
    if not seen.ingestor.idle:
        problems.append(f"{len(seen.ingestor.pending)} ingest wave(s) never finished")
    ingested = {r["document_key"] for wave in seen.ingestor.done for r in wave.results}
    by_key = db.by_key
    missing = [f.key for f in seen.corpus if f.key not in ingested or f.key not in by_key]
    if missing:
        problems.append(f"{len(missing)} file(s) without a job, e.g. {missing[:3]}")
    twice = [key for key, jobs in by_key.items() if len(jobs) != 1]
    if twice:
        problems.append(f"{len(twice)} document(s) with more than one version or job")
    unknown = set(by_key) - {f.key for f in seen.corpus}
    if unknown:
        problems.append(f"{len(unknown)} unexpected document(s)")
    counts = db.status_counts
    if not seen.drained or counts["PENDING"] or counts["PROCESSING"]:
        problems.append(
            f"not drained: {counts['PENDING']} PENDING, {counts['PROCESSING']} PROCESSING"
        )
    return check("drained", problems, f"{len(db.jobs)} jobs, all SUCCEEDED or FAILED")


def faulted_documents(seen: Observed, db: Stored) -> tuple[dict[str, set[str]], int]:
    """Document key -> the invalid-vector kinds its texts were answered with; and how many
    such answers matched no document (that would make the attribution wrong). A text is a
    stored chunk's, or names its document by the corpus's markers: a small document's chunks
    are stored only with its vectors, so one whose embedding failed has none stored."""
    faulted: dict[str, set[str]] = defaultdict(set)
    unattributed = 0
    document_numbers = re.compile(rf"cxm{re.escape(seen.tag)}d(\d{{4}})s\d{{3}}")
    key_of_number = {f.key.split("-", 1)[0]: f.key for f in seen.corpus}
    for fault in seen.vector_faults:
        keys = set().union(*(db.keys_of_text.get(text, set()) for text in fault.texts))
        for text in fault.texts:
            numbers = {m.group(1) for m in document_numbers.finditer(text)}
            keys.update(key_of_number[n] for n in numbers if n in key_of_number)
        if not keys:
            unattributed += 1
        for key in keys:
            faulted[key].add(fault.kind)
    return dict(faulted), unattributed


def outcome_of(job: dict[str, Any]) -> str:
    if job["status"] == "FAILED":
        return f"FAILED {job['last_failure_type']}"
    return str(job["status"])


def _served(job: dict[str, Any]) -> bool:
    """Whether the job's model serves the job's version for its document."""
    return bool(
        job["served_version_id"] is not None and job["served_version_id"] == job["version_id"]
    )


def check_outcomes(
    seen: Observed, db: Stored, faulted: Mapping[str, set[str]], unattributed: int
) -> tuple[Check, Counter[str], int]:
    """The check, the outcome counts, and how many faulted documents a later attempt indexed."""
    problems = []
    if unattributed:
        problems.append(f"{unattributed} invalid-vector answer(s) match no stored chunk")
    outcomes: Counter[str] = Counter()
    absorbed = 0
    by_key = db.by_key
    for file in seen.corpus:
        if file.key not in by_key:
            continue  # reported by "drained"
        job = by_key[file.key][0]
        outcome = outcome_of(job)
        outcomes[outcome] += 1
        attempts = db.attempts.get(job["job_id"], [])
        last = attempts[-1] if attempts else None
        if outcome.startswith("FAILED"):
            if last is None or (last["status"], last["failure_type"]) != (
                "FAILED",
                job["last_failure_type"],
            ):
                problems.append(f"{file.key}: FAILED, but not by its last attempt's report")
            if _served(job):
                problems.append(f"{file.key}: FAILED yet its model serves the version")
        if job["attempt_count"] >= job["max_attempts"]:
            problems.append(f"{file.key}: used all {job['max_attempts']} attempts")
        if not file.valid:
            if outcome != "FAILED DOCUMENT_CONTENT_INVALID":
                problems.append(f"{file.key} ({file.kind}): {outcome}")
        elif outcome == "SUCCEEDED":
            if not _served(job):
                problems.append(f"{file.key}: SUCCEEDED but its model does not serve the version")
            if not job["serving"]:
                problems.append(f"{file.key}: SUCCEEDED for a model that does not serve search")
            if file.key in faulted:
                # absorbed by a later attempt, or within the attempt: a request shared by several
                # jobs that got an invalid vector is sent again per job (embedding/batching.py),
                # and the stored vectors are checked on their own (finite, right, once)
                absorbed += 1
        elif outcome == "FAILED EMBEDDING_RESULT_INVALID":
            if file.key not in faulted:
                problems.append(f"{file.key}: {outcome} without any invalid vector served")
        else:
            problems.append(f"{file.key} ({file.kind}): {outcome}")
    fine = (
        f"{outcomes['SUCCEEDED']} SUCCEEDED and served, "
        f"{outcomes['FAILED DOCUMENT_CONTENT_INVALID']} FAILED "
        f"DOCUMENT_CONTENT_INVALID (all {sum(not f.valid for f in seen.corpus)} invalid files), "
        f"{outcomes['FAILED EMBEDDING_RESULT_INVALID']} FAILED EMBEDDING_RESULT_INVALID; "
        f"{len(faulted)} documents got an invalid vector, {absorbed} of them SUCCEEDED all the "
        "same "
        "(by a later attempt, or within the attempt when the invalid answer came in a request "
        "shared with other jobs and the job's texts were sent again alone)"
    )
    return check("outcomes", problems, fine), outcomes, absorbed


def check_embeddings_per_job(db: Stored) -> Check:
    problems = []
    for job in db.jobs:
        key, n = job["external_key"], job["chunks"]
        if job["status"] == "SUCCEEDED":
            if not (
                n >= 1
                and job["vectors"] == job["all_vectors"] == job["chunk_count"] == n
                and job["distinct_indexes"] == n
                and job["max_index"] == n - 1
            ):
                problems.append(
                    f"{key}: {job['vectors']} embeddings ({job['all_vectors']} on the version), "
                    f"{n} chunks, chunk_count {job['chunk_count']}, indexes up to "
                    f"{job['max_index']}"
                )
        elif job["status"] == "FAILED":
            if job["all_vectors"]:
                problems.append(f"{key}: FAILED with {job['all_vectors']} embeddings of its model")
            if _served(job):
                problems.append(f"{key}: FAILED yet its model serves the version")
    succeeded = [job for job in db.jobs if job["status"] == "SUCCEEDED"]
    return check(
        "embeddings_per_job",
        problems,
        f"{len(succeeded)} SUCCEEDED jobs, {sum(j['chunks'] for j in succeeded)} chunks, one "
        "embedding each",
    )


def check_served_forward(db: Stored) -> Check:
    """Per (document, model): the served version is the newest version the model completed."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    for job in db.jobs:
        groups[(job["external_key"], job["model_id"])].append(job)
    problems = []
    served = 0
    for (key, _), jobs in groups.items():
        completed = [j["version_no"] for j in jobs if j["status"] == "SUCCEEDED"]
        newest = max(completed, default=None)
        serves = jobs[0]["served_version_no"]
        if serves is not None:
            served += 1
        if serves != newest:
            if newest is None:
                problems.append(
                    f"{key}: serves version {serves}, which no job of its model completed"
                )
            else:
                problems.append(
                    f"{key}: serves version {serves}, not version {newest}, the newest its model "
                    "completed"
                )
    return check(
        "served_forward",
        problems,
        f"{served} (document, model) pairs served, each at the newest version its model completed",
    )


def check_no_duplicates(db: Stored) -> Check:
    duplicates = query(
        db.url,
        """SELECT chunk_id, embedding_model_id FROM embeddings
           GROUP BY chunk_id, embedding_model_id HAVING count(*) > 1""",
    )
    problems = (
        [f"{len(duplicates)} (chunk, model) pairs with several embeddings"] if duplicates else []
    )
    return check("no_duplicates", problems, "none")


def check_vectors(db: Stored) -> tuple[Check, int]:
    """The check and how many vectors it compared."""
    problems = []
    stored = 0
    with connect(db.url) as conn:
        cursor = conn.execute(
            """SELECT e.vector, e.dimension, e.vector_sha256, e.document_id,
                      e.document_version_id, c.content, c.document_id AS chunk_document,
                      c.document_version_id AS chunk_version, d.external_key
               FROM embeddings e
               JOIN document_chunks c ON c.id = e.chunk_id
               JOIN documents d ON d.id = c.document_id"""
        )
        for row in cursor:
            stored += 1
            key = row["external_key"]
            vector = np.asarray(row["vector"].to_numpy(), dtype=np.float32)
            expected = np.asarray(fake_vector(row["content"], DIMENSION), dtype=np.float32)
            if row["dimension"] != DIMENSION or vector.shape != (DIMENSION,):
                problems.append(f"{key}: a vector of shape {vector.shape}")
            elif not np.all(np.isfinite(vector)) or not np.allclose(vector, expected, atol=1e-6):
                problems.append(f"{key}: a vector that is not its chunk's")
            elif row["vector_sha256"] != vector_sha256(vector.tolist()):
                problems.append(f"{key}: vector_sha256 does not match the vector")
            if (row["document_id"], row["document_version_id"]) != (
                row["chunk_document"],
                row["chunk_version"],
            ):
                problems.append(f"{key}: denormalised ids differ from the chunk's")
    fine = f"{stored} vectors equal the server's vector for their chunk's text"
    return check("vectors_intact", problems, fine), stored


def check_leases(db: Stored) -> Check:
    started = query(
        db.url, "SELECT count(*) AS n FROM trioindex_job_attempts WHERE status = 'STARTED'"
    )
    past = [
        j["external_key"] for j in db.jobs if j["status"] == "PROCESSING" and j["lease_expired"]
    ]
    problems = []
    if past:
        problems.append(f"{len(past)} job(s) PROCESSING past their lease, e.g. {past[:3]}")
    if db.status_counts["PROCESSING"]:
        problems.append(f"{db.status_counts['PROCESSING']} job(s) still PROCESSING")
    if started[0]["n"]:
        problems.append(f"{started[0]['n']} attempt(s) still STARTED")
    return check("no_processing_past_lease", problems, "none")


def check_attempts(db: Stored) -> Check:
    problems = []
    final_status = {"SUCCEEDED": ("SUCCEEDED",), "FAILED": ("FAILED", "EXPIRED")}
    for job in db.jobs:
        key, rows = job["external_key"], db.attempts.get(job["job_id"], [])
        numbers = [row["attempt_no"] for row in rows]
        if numbers != list(range(1, job["attempt_count"] + 1)):
            problems.append(f"{key}: attempts {numbers} for attempt_count {job['attempt_count']}")
            continue
        statuses = [row["status"] for row in rows]
        # CANCELLED: handed back at shutdown (not counted against the budget)
        if any(status not in ("FAILED", "EXPIRED", "CANCELLED") for status in statuses[:-1]):
            problems.append(f"{key}: attempt statuses {statuses}")
        if statuses and statuses[-1] not in final_status.get(job["status"], ()):
            problems.append(f"{key}: job {job['status']} but its last attempt {statuses[-1]}")
    return check(
        "attempts_consecutive",
        problems,
        f"{len(db.attempt_rows)} attempts over {len(db.jobs)} jobs, numbered 1..n without gaps",
    )


def check_workers(seen: Observed, db: Stored) -> tuple[Check, int]:
    """The check and how many exits were excused (fast failures at start during an outage)."""
    problems = []
    excused = 0
    for process in seen.exits:
        ended = process.ended_at or 0.0
        in_outage = any(
            start - OUTAGE_SLACK <= ended and process.started_at <= end + OUTAGE_SLACK
            for _, start, end in seen.outages
        )
        if in_outage and not process.registered():
            excused += 1
        else:
            problems.append(
                f"worker {process.number} exited with status {process.returncode} at {ended:.0f}s "
                f"({'after' if process.registered() else 'before'} registering)"
            )
    for process in seen.unregistered:
        problems.append(f"worker {process.number} never registered")
    stopped = [p for p in seen.fleet.processes if p.fate in ("stopped", "hung")]
    for process in stopped:
        if process.fate == "hung":
            problems.append(f"worker {process.number} outlived SIGTERM + grace period")
        elif process.returncode != 0:
            problems.append(f"worker {process.number} exited {process.returncode} on SIGTERM")
    rows = query(
        db.url,
        "SELECT pid, status FROM indexing_workers WHERE pid = ANY(%s)",
        [p.popen.pid for p in stopped],
    )
    not_stopped = sorted(row["pid"] for row in rows if row["status"] != "STOPPED")
    if not_stopped:
        problems.append(f"worker rows of pids {not_stopped} not STOPPED after SIGTERM")
    if len(rows) < len(stopped):
        problems.append("a worker stopped by SIGTERM has no worker row")
    fine = (
        f"{len(seen.fleet.processes)} worker processes; {len(stopped)} stopped by SIGTERM with "
        f"status 0 and rows STOPPED; {excused} failed fast at start during an outage"
    )
    return check("workers_survived", problems, fine), excused


def check_faults_exercised(seen: Observed, db: Stored) -> Check:
    kills = sum(1 for p in seen.fleet.processes if p.fate == "killed")
    faults = seen.server.faults
    storage_failures = sum(
        1
        for row in db.attempt_rows
        if (row["status"], row["failure_type"]) == ("FAILED", "STORAGE_UNAVAILABLE")
    )
    recoveries = db.events["LEASE_EXPIRED_REQUEUED"] + db.events["LEASE_EXPIRED_FAILED"]
    problems = []
    if not kills:
        problems.append("no worker was killed")
    # A kind expected 8+ times is missing by chance with probability < e^-8; rarer kinds are
    # only required together: at least one invalid vector.
    missing = sorted(
        kind
        for kind, rate in seen.fault_rates.items()
        if rate * seen.server.embed_requests >= 8 and not faults.get(kind)
    )
    if missing:
        problems.append(f"fault kinds never injected: {missing}")
    if not seen.vector_faults and any(k in VECTOR_FAULTS for k in seen.fault_rates):
        problems.append("no invalid vector was served")
    if sorted(what for what, _, _ in seen.outages) != sorted(plan.what for plan in OUTAGES):
        problems.append("an outage did not happen")
    if not storage_failures:
        problems.append("the storage outage failed no attempt (it met no job)")
    if not recoveries:
        problems.append("no lease was recovered")
    if not db.events["JOB_RETRY_SCHEDULED"]:
        problems.append("no retry was scheduled")
    fine = (
        f"{kills} kills, {sum(faults.values())} embedding faults ({len(seen.vector_faults)} "
        f"invalid vectors), {storage_failures} attempts failed by the storage outage, the "
        f"database restart, {recoveries} lease recoveries, "
        f"{db.events['JOB_RETRY_SCHEDULED']} retries"
    )
    return check("faults_exercised", problems, fine)


def run_checks(seen: Observed, db: Stored) -> tuple[list[Check], dict[str, Any]]:
    """Every check of :data:`CHECKS`, in that order, and the counts for the report."""
    faulted, unattributed = faulted_documents(seen, db)
    outcomes, outcome_counts, absorbed = check_outcomes(seen, db, faulted, unattributed)
    vectors, stored = check_vectors(db)
    log_checks, log_bytes = check_logs(seen, db)
    workers, excused = check_workers(seen, db)
    checks = [
        check_drained(seen, db),
        outcomes,
        check_embeddings_per_job(db),
        check_served_forward(db),
        check_no_duplicates(db),
        vectors,
        check_leases(db),
        check_attempts(db),
        *log_checks,
        workers,
        check_faults_exercised(seen, db),
    ]
    assert [c.name for c in checks] == list(CHECKS)
    faults = dict(sorted(seen.server.faults.items()))
    attempt_rows = db.attempt_rows
    counts: dict[str, Any] = {
        "documents": len(seen.corpus),
        "valid_documents": sum(f.valid for f in seen.corpus),
        "invalid_documents": sum(not f.valid for f in seen.corpus),
        "outcomes": dict(sorted(outcome_counts.items())),
        "jobs_by_status": dict(sorted(db.status_counts.items())),
        "chunks_indexed": sum(j["chunks"] for j in db.jobs if j["status"] == "SUCCEEDED"),
        "embeddings": stored,
        "kills": sum(1 for p in seen.fleet.processes if p.fate == "killed"),
        "workers_started": len(seen.fleet.processes),
        "worker_exits_on_their_own": len(seen.exits),
        "worker_exits_excused": excused,
        "embed_requests": seen.server.embed_requests,
        "faults_injected": faults,
        "faults_injected_total": sum(faults.values()),
        "invalid_vector_answers": len(seen.vector_faults),
        "documents_with_invalid_vector": len(faulted),
        "invalid_vector_absorbed": absorbed,
        "storage_connections_reset": seen.storage_resets,
        "retries": sum(db.retries_by_type.values()),
        "retries_by_type": dict(sorted(db.retries_by_type.items())),
        "recoveries": db.events["LEASE_EXPIRED_REQUEUED"] + db.events["LEASE_EXPIRED_FAILED"],
        "recoveries_failed": db.events["LEASE_EXPIRED_FAILED"],
        "attempts": len(attempt_rows),
        "attempts_by_status": dict(sorted(Counter(str(r["status"]) for r in attempt_rows).items())),
        "failed_attempts_by_type": dict(
            sorted(
                Counter(
                    str(r["failure_type"]) for r in attempt_rows if r["status"] == "FAILED"
                ).items()
            )
        ),
        "claims": len(db.tokens),
        "ingest_failures": seen.ingestor.failures,
        "log_bytes_scanned": log_bytes,
        "worker_warnings": worker_warnings(seen),
    }
    return checks, counts
