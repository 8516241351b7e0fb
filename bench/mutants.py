"""A mutation pass over the fencing, locking, retry, hand-back, drain and shutdown code.

``just mutants`` (``python -m bench.mutants``). Owns the curated catalogue of mutants
(:data:`CATALOGUE`) and the runner that tries each one against the tests that should kill it.

A mutant is one text replacement in one file of ``src/trioindex`` — a migration or a module.
It is applied to a copy of the package in a temporary folder, never to the working tree (other
people run tests against it at the same time), and the mutant's test files run with
``PYTHONPATH`` pointing at the copy: that wins over the editable install, and the database
fixtures migrate their template database from the migrations of whichever ``trioindex`` is
imported, so SQL mutants take effect. ``pytest -x`` failing means the mutant was *killed*;
passing means it *survived*; a run past ``--timeout`` is killed too (the tests noticed a hang).
A mutant listed with a reason as *equivalent* cannot change any observable behaviour; it is
run all the same (unless ``--skip-equivalent``), so a wrong claim of equivalence shows up as
"killed".

Why a curated list rather than mutmut or cosmic-ray: most of the code under test is SQL held
in strings and migrations, where those tools can only replace a whole string (every test dies
at once and nothing is learnt), while the mutants that matter remove one condition, one
``FOR UPDATE`` or one ``SKIP LOCKED``. The Python mutants are chosen the same way: each
removes one guard of the shutdown, renewal, hand-back and drain paths. Every entry must match
its file exactly once (``--check``, also run by ``tests/test_mutants.py``), so the catalogue
fails loudly when the code it mutates changes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import attrs

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "src" / "trioindex"
RESULT_PAGE = REPO_ROOT / "docs" / "test-results" / "mutation.md"

LIFECYCLE_TESTS = ("tests/test_lifecycle.py", "tests/test_runtime_postgres.py")
RUNTIME_TESTS = ("tests/test_runtime.py", "tests/test_runtime_postgres.py")
STORE_TESTS = ("tests/test_runtime_postgres.py",)

M0002 = "db/migrations/0002_fenced_functions.sql"
M0003 = "db/migrations/0003_forward_only_and_hand_back.sql"


# A first pass runs only the tests most likely to kill a mutant, chosen by the part of its name
# before the colon: a ``pytest -k`` expression over its test files, or for the runtime the fake-
# clock tests alone (about a second; a mutant that makes them hang is stopped after
# ``QUICK_TIMEOUT``). A mutant that survives the first pass runs its whole test files.
FOCUS = {
    "fence": "forged or one_changed or waiting_on_the_job_lock or mid_write",
    "renew": "forged or one_changed or waiting_on_the_job_lock or mid_write",
    "claim": "claim or renewal_keeps",
    "recover": "recover or expired or lease",
    "complete": "complete or older_version or forged",
    "release": "release or hand or forged or shutdown",
    "drain": "drain",
    "heartbeat": "heartbeat or not_running",
    "worker status": "status or not_running or stop",
    "fail": "fail or retr or forged",
    "fenced errors": "forged or one_changed",
    "store": "cleanup",
}
QUICK = {"runtime": ("tests/test_runtime.py",)}
QUICK_TIMEOUT = 60.0


@attrs.frozen
class Mutant:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``path`` (relative to the
    package), then run ``tests`` (after a focused ``first_pass``, if any)."""

    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    first_pass: tuple[str, ...] | None  # pytest arguments of the focused pass, if any
    equivalent: str | None = None


def _m(
    name: str,
    area: str,
    path: str,
    old: str,
    new: str,
    *,
    tests: tuple[str, ...] = LIFECYCLE_TESTS,
    equivalent: str | None = None,
) -> Mutant:
    # equivalent mutants go straight to the full run: a focused pass could only survive too
    prefix = name.split(":", maxsplit=1)[0]
    first_pass: tuple[str, ...] | None = None
    if equivalent is None and prefix in FOCUS:
        first_pass = (*tests, "-k", FOCUS[prefix])
    elif equivalent is None and prefix in QUICK:
        first_pass = QUICK[prefix]
    return Mutant(name, area, path, old, new, tests, first_pass, equivalent)


_FENCE_CALL = "j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);"
_UNFENCED = "SELECT * INTO j FROM embedding_jobs WHERE id = p_job;"
_RELEASE_FENCE = _FENCE_CALL + "\n    UPDATE embedding_job_attempts SET status = 'CANCELLED'"
_COMPLETE_FENCE = _FENCE_CALL + "\n    SELECT * INTO v FROM document_versions"

CATALOGUE: tuple[Mutant, ...] = (
    # -- the fence: trioindex_lock_owned_job (migration 0002) ----------------------------------
    _m(
        "fence: no job row lock",
        "locking",
        M0002,
        "WHERE id = p_job FOR UPDATE;",
        "WHERE id = p_job;",
    ),
    _m(
        "fence: no 'job exists' check",
        "fencing",
        M0002,
        "    IF NOT FOUND THEN\n        RAISE EXCEPTION USING ERRCODE = 'TI001', MESSAGE = 'the job no longer exists';\n    END IF;\n",
        "",
        equivalent="a missing job reads as a row of NULLs, which the worker check refuses with "
        "the same TI001 (only the message differs)",
    ),
    _m(
        "fence: no 'job is PROCESSING' check",
        "fencing",
        M0002,
        "    IF j.status <> 'PROCESSING' THEN\n",
        "    IF false THEN\n",
        equivalent="the schema's CHECK gives a job that is not PROCESSING a NULL worker and "
        "token, which the worker and token checks refuse",
    ),
    _m(
        "fence: no job-worker check",
        "fencing",
        M0002,
        "IF j.worker_id IS DISTINCT FROM p_worker THEN",
        "IF false THEN",
    ),
    _m(
        "fence: no claim-token check",
        "fencing",
        M0002,
        "IF j.claim_token IS DISTINCT FROM p_token THEN",
        "IF false THEN",
    ),
    _m(
        "fence: no lease check",
        "fencing",
        M0002,
        "IF j.lease_expires_at <= clock_timestamp() THEN",
        "IF false THEN",
    ),
    _m(
        "fence: lease checked against the transaction's start",
        "fencing",
        M0002,
        "IF j.lease_expires_at <= clock_timestamp() THEN",
        "IF j.lease_expires_at <= now() THEN",
        equivalent="every caller runs the fence as the first statement of its transaction, so "
        "now() and clock_timestamp() differ by microseconds",
    ),
    _m(
        "fence: attempt of any job",
        "fencing",
        M0002,
        "WHERE id = p_attempt AND embedding_job_id = p_job;",
        "WHERE id = p_attempt;",
    ),
    _m(
        "fence: no 'attempt exists' check",
        "fencing",
        M0002,
        "IF NOT FOUND OR a.status <> 'STARTED'",
        "IF a.status <> 'STARTED'",
    ),
    _m(
        "fence: no attempt-status check",
        "fencing",
        M0002,
        "IF NOT FOUND OR a.status <> 'STARTED' OR a.worker_id <> p_worker",
        "IF NOT FOUND OR a.worker_id <> p_worker",
    ),
    _m(
        "fence: no attempt-worker check",
        "fencing",
        M0002,
        "OR a.worker_id <> p_worker\n",
        "\n",
    ),
    _m(
        "fence: no attempt-number check",
        "fencing",
        M0002,
        "       OR a.attempt_no <> j.attempt_count THEN",
        "       THEN",
    ),
    # -- renewal (lifecycle.renew_lease) --------------------------------------------------------
    _m(
        "renew: no job-worker condition",
        "fencing",
        "db/jobs.py",
        "WHERE id = %(job)s AND worker_id = %(worker)s AND claim_token",
        "WHERE id = %(job)s AND claim_token",
    ),
    _m(
        "renew: no claim-token condition",
        "fencing",
        "db/jobs.py",
        "AND claim_token = %(token)s\n",
        "\n",
    ),
    _m(
        "renew: no 'job is PROCESSING' condition",
        "fencing",
        "db/jobs.py",
        "AND status = 'PROCESSING' AND lease_expires_at > clock_timestamp()",
        "AND lease_expires_at > clock_timestamp()",
        equivalent="the schema's CHECK gives a job that is not PROCESSING a NULL worker and "
        "token, so the worker and token conditions do not match it",
    ),
    _m(
        "renew: no lease condition",
        "fencing",
        "db/jobs.py",
        "AND status = 'PROCESSING' AND lease_expires_at > clock_timestamp()",
        "AND status = 'PROCESSING'",
    ),
    _m(
        "renew: no attempt-number condition",
        "fencing",
        "db/jobs.py",
        "AND attempt_count = (\n                 SELECT attempt_no",
        "AND EXISTS (\n                 SELECT attempt_no",
    ),
    _m(
        "renew: attempt of any job",
        "fencing",
        "db/jobs.py",
        "WHERE id = %(attempt)s AND embedding_job_id = %(job)s",
        "WHERE id = %(attempt)s",
    ),
    _m(
        "renew: no attempt-status condition",
        "fencing",
        "db/jobs.py",
        "AND status = 'STARTED' AND worker_id = %(worker)s)",
        "AND worker_id = %(worker)s)",
    ),
    _m(
        "renew: no attempt-worker condition",
        "fencing",
        "db/jobs.py",
        "AND status = 'STARTED' AND worker_id = %(worker)s)",
        "AND status = 'STARTED')",
    ),
    # -- claim (lifecycle._CLAIM_SQL) -----------------------------------------------------------
    _m(
        "claim: waits for locked rows (no SKIP LOCKED)",
        "locking",
        "db/jobs.py",
        "FOR UPDATE OF j SKIP LOCKED",
        "FOR UPDATE OF j",
    ),
    _m(
        "claim: no row lock",
        "locking",
        "db/jobs.py",
        "    LIMIT %(k)s\n    FOR UPDATE OF j SKIP LOCKED\n",
        "    LIMIT %(k)s\n",
    ),
    _m(
        "claim: attempt number not incremented",
        "retry",
        "db/jobs.py",
        "attempt_count = j.attempt_count + 1",
        "attempt_count = j.attempt_count",
    ),
    _m(
        "claim: attempt number skips one",
        "retry",
        "db/jobs.py",
        "attempt_count = j.attempt_count + 1",
        "attempt_count = j.attempt_count + 2",
    ),
    _m(
        "claim: any worker status may claim",
        "shutdown",
        "db/jobs.py",
        "WHERE id = %(worker)s AND status = 'RUNNING'",
        "WHERE id = %(worker)s",
    ),
    _m(
        "claim: scheduled retries claimable early",
        "retry",
        "db/jobs.py",
        "WHERE j.status = 'PENDING' AND j.available_at <= now()",
        "WHERE j.status = 'PENDING'",
    ),
    _m(
        "claim: age ignored in claim order",
        "retry",
        "db/jobs.py",
        "ORDER BY j.priority DESC, j.available_at, j.id",
        "ORDER BY j.priority DESC, j.id",
    ),
    _m(
        "claim: priority ignored in claim order",
        "retry",
        "db/jobs.py",
        "ORDER BY j.priority DESC, j.available_at, j.id",
        "ORDER BY j.available_at, j.id",
    ),
    _m(
        "claim: model filter dropped",
        "locking",
        "db/jobs.py",
        "    WHERE j.status = 'PENDING' AND j.available_at <= now()\n"
        "      AND (%(model)s::uuid IS NULL OR j.embedding_model_id = %(model)s::uuid)\n",
        "    WHERE j.status = 'PENDING' AND j.available_at <= now()\n",
    ),
    # -- recovery (lifecycle._RECOVER_SQL) ------------------------------------------------------
    _m(
        "recover: waits for locked rows (no SKIP LOCKED)",
        "locking",
        "db/jobs.py",
        "    LIMIT %(batch)s\n    FOR UPDATE SKIP LOCKED\n",
        "    LIMIT %(batch)s\n    FOR UPDATE\n",
    ),
    _m(
        "recover: no row lock",
        "locking",
        "db/jobs.py",
        "    LIMIT %(batch)s\n    FOR UPDATE SKIP LOCKED\n",
        "    LIMIT %(batch)s\n",
    ),
    _m(
        "recover: valid leases recovered too",
        "locking",
        "db/jobs.py",
        "WHERE status = 'PROCESSING' AND lease_expires_at <= clock_timestamp()\n    ORDER BY",
        "WHERE status = 'PROCESSING'\n    ORDER BY",
    ),
    _m(
        "recover: the last attempt is requeued",
        "retry",
        "db/jobs.py",
        "SET status = CASE WHEN j.attempt_count < j.max_attempts THEN 'PENDING'",
        "SET status = CASE WHEN j.attempt_count <= j.max_attempts THEN 'PENDING'",
    ),
    _m(
        "recover: every attempt of the job expired",
        "retry",
        "db/jobs.py",
        "WHERE a.embedding_job_id = e.id AND a.status = 'STARTED'",
        "WHERE a.embedding_job_id = e.id",
    ),
    # -- completion (trioindex_complete_job, migration 0003) ------------------------------------
    _m(
        "complete: not fenced",
        "fencing",
        M0003,
        _COMPLETE_FENCE,
        _UNFENCED + "\n    SELECT * INTO v FROM document_versions",
    ),
    _m(
        "complete: no version row lock",
        "locking",
        M0003,
        "WHERE id = j.document_version_id FOR UPDATE;",
        "WHERE id = j.document_version_id;",
        equivalent="a version is created with exactly one job (ingest), and every writer of a "
        "version row (the steps, failure, recovery, jobs retry) locks that job's row first, "
        "which the completion already holds",
    ),
    _m(
        "complete: no 'version is EMBEDDING' guard",
        "fencing",
        M0003,
        "    IF v.status <> 'EMBEDDING' THEN\n",
        "    IF false THEN\n",
    ),
    _m(
        "complete: no zero-chunks guard",
        "fencing",
        M0003,
        "IF n_chunks = 0 OR n_chunks <> n_vectors THEN",
        "IF n_chunks <> n_vectors THEN",
    ),
    _m(
        "complete: no chunks = vectors guard",
        "fencing",
        M0003,
        "IF n_chunks = 0 OR n_chunks <> n_vectors THEN",
        "IF n_chunks = 0 THEN",
    ),
    _m(
        "complete: vectors of any model counted",
        "fencing",
        M0003,
        "    WHERE document_version_id = v.id AND embedding_model_id = j.embedding_model_id;",
        "    WHERE document_version_id = v.id;",
    ),
    _m(
        "complete: no document row lock",
        "locking",
        M0003,
        "    PERFORM 1 FROM documents WHERE id = v.document_id FOR UPDATE;\n",
        "",
    ),
    _m(
        "complete: searchable version always moves",
        "forward-only",
        M0003,
        "became_current := current_no IS NULL OR current_no < v.version_no;",
        "became_current := true;",
    ),
    _m(
        "complete: first version never current",
        "forward-only",
        M0003,
        "became_current := current_no IS NULL OR current_no < v.version_no;",
        "became_current := current_no < v.version_no;",
    ),
    _m(
        "complete: current version read in the locking statement (issue 11's bug)",
        "forward-only",
        M0003,
        "    PERFORM 1 FROM documents WHERE id = v.document_id FOR UPDATE;\n"
        "    SELECT cur.version_no INTO current_no\n"
        "    FROM documents d JOIN document_versions cur ON cur.id = d.current_version_id\n"
        "    WHERE d.id = v.document_id;\n",
        "    SELECT cur.version_no INTO current_no\n"
        "    FROM documents d LEFT JOIN document_versions cur ON cur.id = d.current_version_id\n"
        "    WHERE d.id = v.document_id\n"
        "    FOR UPDATE OF d;\n",
    ),
    # -- hand-back (trioindex_release_job, migration 0003) --------------------------------------
    _m(
        "release: not fenced",
        "hand-back",
        M0003,
        _RELEASE_FENCE,
        _UNFENCED + "\n    UPDATE embedding_job_attempts SET status = 'CANCELLED'",
    ),
    _m(
        "release: the attempt counts against the budget",
        "hand-back",
        M0003,
        "max_attempts = max_attempts + 1,",
        "max_attempts = max_attempts,",
    ),
    _m(
        "release: attempt marked EXPIRED, not CANCELLED",
        "hand-back",
        M0003,
        "SET status = 'CANCELLED', finished_at = now()",
        "SET status = 'EXPIRED', finished_at = now()",
    ),
    _m(
        "release: keeps its old available_at",
        "hand-back",
        M0003,
        "SET status = 'PENDING', available_at = now(), max_attempts",
        "SET status = 'PENDING', max_attempts",
        equivalent="a claimed job's available_at is already past, so it is claimable at once "
        "either way; only its place among jobs of equal priority moves, which nothing promises",
    ),
    _m(
        "release: no NOTIFY",
        "hand-back",
        M0003,
        "            jsonb_build_object('attempt_no', j.attempt_count, 'reason', 'shutdown'));\n"
        "    NOTIFY trioindex_jobs;\n",
        "            jsonb_build_object('attempt_no', j.attempt_count, 'reason', 'shutdown'));\n",
    ),
    # -- drain (lifecycle._DRAIN_SQL) -----------------------------------------------------------
    _m(
        "drain: a stopped worker's jobs count as held",
        "drain",
        "db/jobs.py",
        "AND NOT (w.status = 'RUNNING'\n                    AND w.last_heartbeat_at",
        "AND NOT (w.last_heartbeat_at",
    ),
    _m(
        "drain: a silent worker's jobs count as held",
        "drain",
        "db/jobs.py",
        "AND NOT (w.status = 'RUNNING'\n"
        "                    AND w.last_heartbeat_at > now() - make_interval(secs => %(timeout)s))",
        "AND NOT (w.status = 'RUNNING')",
    ),
    _m(
        "drain: its own jobs count as orphans",
        "drain",
        "db/jobs.py",
        "WHERE j.worker_id IS DISTINCT FROM %(me)s\n  AND",
        "WHERE",
    ),
    _m(
        "drain: other models' jobs counted",
        "drain",
        "db/jobs.py",
        "  AND (%(model)s::uuid IS NULL OR j.embedding_model_id = %(model)s::uuid)\n"
        "  AND (j.status = 'PENDING'",
        "  AND (j.status = 'PENDING'",
    ),
    # -- workers (lifecycle.heartbeat, set_worker_status) ---------------------------------------
    _m(
        "heartbeat: writes nothing",
        "shutdown",
        "db/jobs.py",
        "UPDATE indexing_workers SET last_heartbeat_at = now()",
        "UPDATE indexing_workers SET last_heartbeat_at = last_heartbeat_at",
    ),
    _m(
        "heartbeat: revives a STOPPED worker",
        "shutdown",
        "db/jobs.py",
        "WHERE id = %s AND status <> 'STOPPED' RETURNING id",
        "WHERE id = %s RETURNING id",
    ),
    _m(
        "worker status: STOPPED is not final",
        "shutdown",
        "db/jobs.py",
        "WHERE id = %(id)s AND status <> 'STOPPED' RETURNING id",
        "WHERE id = %(id)s RETURNING id",
    ),
    # -- failure reports (lifecycle.fail_job and the error mapping) -----------------------------
    _m(
        "fail: not fenced",
        "fencing",
        "db/jobs.py",
        "        owned = lock_owned_job(conn, claim)\n",
        "        owned = OwnedJob(claim.job_id, claim.document_version_id,"
        " claim.embedding_model_id, claim.attempt_no, 3)\n",
    ),
    _m(
        "fail: non-retryable failures retried",
        "retry",
        "db/jobs.py",
        "retry = failure_type.retryable and owned.attempt_count < owned.max_attempts",
        "retry = owned.attempt_count < owned.max_attempts",
    ),
    _m(
        "fail: retried past the budget",
        "retry",
        "db/jobs.py",
        "retry = failure_type.retryable and owned.attempt_count < owned.max_attempts",
        "retry = failure_type.retryable",
    ),
    _m(
        "fail: the last attempt retried",
        "retry",
        "db/jobs.py",
        "retry = failure_type.retryable and owned.attempt_count < owned.max_attempts",
        "retry = failure_type.retryable and owned.attempt_count <= owned.max_attempts",
    ),
    _m(
        "fail: no version row lock",
        "locking",
        "db/jobs.py",
        "            lock_version(conn, owned.document_version_id)\n",
        "",
        equivalent="the UPDATE of the version two statements later takes the same lock, still "
        "after the job's, and the version always exists (foreign key)",
    ),
    _m(
        "fenced errors: ownership lost not recognised",
        "fencing",
        "db/jobs.py",
        "        if exc.sqlstate == OWNERSHIP_LOST:\n",
        "        if exc.sqlstate == 'none':\n",
    ),
    # -- the store: bounded cleanup writes (store.py) -------------------------------------------
    _m(
        "store: STOPPING/STOPPED write unbounded",
        "shutdown",
        "worker/queue.py",
        "await self.db.run_bounded(\n            self.cleanup_timeout, lifecycle.set_worker_status,",
        "await self.db.run(\n            lifecycle.set_worker_status,",
        tests=STORE_TESTS,
    ),
    _m(
        "store: hand-back unbounded",
        "hand-back",
        "worker/queue.py",
        "await self.db.run_bounded(self.cleanup_timeout, lifecycle.release_job, claim)",
        "await self.db.run(lifecycle.release_job, claim)",
        tests=STORE_TESTS,
    ),
    _m(
        "store: failure report unbounded",
        "shutdown",
        "worker/queue.py",
        "return await self.db.run_bounded(\n            self.cleanup_timeout, lifecycle.fail_job,",
        "return await self.db.run(\n            lifecycle.fail_job,",
        tests=STORE_TESTS,
    ),
    # -- the runtime (runtime.py) ---------------------------------------------------------------
    _m(
        "runtime: renewal sent during the final write",
        "shutdown",
        "worker/runtime.py",
        "            if context.finishing:\n"
        "                return  # the final write is under way; it re-validates ownership itself\n",
        "",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: a renewal refused by the final write counts as a lost lease",
        "shutdown",
        "worker/runtime.py",
        "                if context.finishing:\n"
        "                    return  # raced the final write, which finished the job: not a loss\n",
        "",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: a refused renewal does not cancel the job",
        "fencing",
        "worker/runtime.py",
        "                    context.claim.job_id,\n                )\n"
        "                context.scope.cancel()\n                return\n"
        "            except Exception as exc:",
        "                    context.claim.job_id,\n                )\n"
        "                return\n"
        "            except Exception as exc:",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: failing renewals never give up",
        "fencing",
        "worker/runtime.py",
        "if now >= context.lease_deadline:",
        "if False:",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: a successful renewal does not move the local deadline",
        "fencing",
        "worker/runtime.py",
        "            context.lease_deadline = trio.current_time() + self.settings.lease_duration\n",
        "",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: no heartbeats",
        "shutdown",
        "worker/runtime.py",
        "await self._every(self.settings.heartbeat_interval, self._heartbeat_once)",
        "await trio.sleep_forever()",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: stop request does not stop intake",
        "shutdown",
        "worker/runtime.py",
        "        self._stop_requested = True\n        self._intake.cancel()\n",
        "        self._stop_requested = True\n",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: no grace period",
        "shutdown",
        "worker/runtime.py",
        "trio.current_time() + settings.shutdown_grace_period",
        "trio.current_time()",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: STOPPING not written",
        "shutdown",
        "worker/runtime.py",
        "await self._set_status(WorkerStatus.STOPPING)",
        "await trio.lowlevel.checkpoint()",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: STOPPING write not shielded",
        "shutdown",
        "worker/runtime.py",
        "                    with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "                        await self._set_status(WorkerStatus.STOPPING)",
        "                    with trio.move_on_after(CLEANUP_TIMEOUT):\n"
        "                        await self._set_status(WorkerStatus.STOPPING)",
        tests=RUNTIME_TESTS,
        equivalent="only an outside cancellation (a second signal) can reach it, and that ends "
        "the worker at once: STOPPED is written next either way",
    ),
    _m(
        "runtime: STOPPING write unbounded",
        "shutdown",
        "worker/runtime.py",
        "                    with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "                        await self._set_status(WorkerStatus.STOPPING)",
        "                    with trio.CancelScope(shield=True):\n"
        "                        await self._set_status(WorkerStatus.STOPPING)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: STOPPED not written",
        "shutdown",
        "worker/runtime.py",
        "await self._set_status(WorkerStatus.STOPPED)",
        "await trio.lowlevel.checkpoint()",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: STOPPED write not shielded",
        "shutdown",
        "worker/runtime.py",
        "            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "                await self._set_status(WorkerStatus.STOPPED)",
        "            with trio.move_on_after(CLEANUP_TIMEOUT):\n"
        "                await self._set_status(WorkerStatus.STOPPED)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: STOPPED write unbounded",
        "shutdown",
        "worker/runtime.py",
        "            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "                await self._set_status(WorkerStatus.STOPPED)",
        "            with trio.CancelScope(shield=True):\n"
        "                await self._set_status(WorkerStatus.STOPPED)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: claim call not shielded",
        "shutdown",
        "worker/runtime.py",
        "                with trio.CancelScope(shield=True):\n"
        "                    claims = await self.store.claim(",
        "                with trio.CancelScope():\n"
        "                    claims = await self.store.claim(",
        tests=RUNTIME_TESTS,
        equivalent="Database.run never abandons its thread and returns a committed claim before "
        "any checkpoint, so the claims are started either way; a claim not yet sent when the "
        "stop arrives is simply not made",
    ),
    _m(
        "runtime: completion call not shielded",
        "shutdown",
        "worker/runtime.py",
        "                    with trio.CancelScope(shield=True):\n"
        "                        await self.store.complete(claim)",
        "                    with trio.CancelScope():\n"
        "                        await self.store.complete(claim)",
        tests=RUNTIME_TESTS,
        equivalent="Database.run never abandons its thread and returns a committed completion "
        "before any checkpoint, so it is reported as succeeded either way; a completion not "
        "yet sent when the grace period ends is handed back instead, also a consistent end",
    ),
    _m(
        "runtime: cancelled jobs not handed back",
        "hand-back",
        "worker/runtime.py",
        'if outcome == "cancelled" and not context.lost:',
        "if False:",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: a lost claim is handed back too",
        "hand-back",
        "worker/runtime.py",
        'if outcome == "cancelled" and not context.lost:',
        'if outcome == "cancelled":',
        tests=RUNTIME_TESTS,
        equivalent="a lost job's outcome is already 'lost' here unless an outside cancellation "
        "cut it short, and the fence refuses a lost claim's hand-back anyway",
    ),
    _m(
        "runtime: hand-back not shielded",
        "hand-back",
        "worker/runtime.py",
        "        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "            try:\n                await self.store.release(claim)",
        "        with trio.move_on_after(CLEANUP_TIMEOUT):\n"
        "            try:\n                await self.store.release(claim)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: hand-back unbounded",
        "hand-back",
        "worker/runtime.py",
        "        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "            try:\n                await self.store.release(claim)",
        "        with trio.CancelScope(shield=True):\n"
        "            try:\n                await self.store.release(claim)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: failure report not shielded",
        "shutdown",
        "worker/runtime.py",
        "        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "            return await self._fail(claim, failure_type, message)",
        "        with trio.move_on_after(CLEANUP_TIMEOUT):\n"
        "            return await self._fail(claim, failure_type, message)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: failure report unbounded",
        "shutdown",
        "worker/runtime.py",
        "        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):\n"
        "            return await self._fail(claim, failure_type, message)",
        "        with trio.CancelScope(shield=True):\n"
        "            return await self._fail(claim, failure_type, message)",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: a slot is never given back",
        "locking",
        "worker/runtime.py",
        "            self._slots.release_on_behalf_of(slot)\n",
        "",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: drain ends with work owed",
        "drain",
        "worker/runtime.py",
        "        if state.drained:\n            return None\n",
        "        return None\n",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: drain never ends",
        "drain",
        "worker/runtime.py",
        "        if state.drained:\n            return None\n",
        "",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: drain does not recover expired orphans itself",
        "drain",
        "worker/runtime.py",
        "        if state.expired_orphans:\n            await self._recover_once()\n",
        "        if state.expired_orphans:\n            await trio.lowlevel.checkpoint()\n",
        tests=RUNTIME_TESTS,
    ),
    _m(
        "runtime: drain checked with jobs still running",
        "drain",
        "worker/runtime.py",
        "if drain and not self._running:",
        "if drain:",
        tests=RUNTIME_TESTS,
    ),
)


# ---------------------------------------------------------------------------------------------
# applying


def mutated_source(mutant: Mutant, root: Path = PACKAGE) -> str:
    """The mutated text of the mutant's file; raises if ``old`` does not occur exactly once."""
    text = (root / mutant.path).read_text()
    found = text.count(mutant.old)
    if found != 1:
        raise ValueError(f"{mutant.name!r}: expected one match in {mutant.path}, found {found}")
    return text.replace(mutant.old, mutant.new)


def check_catalogue() -> list[str]:
    """Problems with the catalogue: a pattern that no longer matches once, a duplicate name."""
    problems = []
    names = [m.name for m in CATALOGUE]
    problems += [f"duplicate name {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
    for mutant in CATALOGUE:
        try:
            mutated_source(mutant)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def _copy_package(into: Path) -> Path:
    target = into / "trioindex"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


# ---------------------------------------------------------------------------------------------
# running


@attrs.frozen
class Outcome:
    mutant: Mutant
    result: str  # killed | survived | timeout | error
    killed_by: str
    seconds: float


_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def run_tests(
    package_parent: Path, tests: Sequence[str], timeout: float
) -> tuple[int | None, str, float]:
    """Run pytest on ``tests`` against the package under ``package_parent``; (exit code or None
    on timeout, output, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(package_parent), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    with subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
            return proc.returncode, output, time.monotonic() - started
        except subprocess.TimeoutExpired:
            # SIGINT first: pytest then runs its fixture teardown, which stops the embedded
            # PostgreSQL it started; SIGKILL the whole group only if that does not end it
            os.killpg(proc.pid, signal.SIGINT)
            try:
                output, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            return None, output, time.monotonic() - started


def _imports_from(package_parent: Path) -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import trioindex; print(trioindex.__file__)"],
        env={**os.environ, "PYTHONPATH": str(package_parent)},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    return Path(probe.stdout.strip()).is_relative_to(package_parent)


def try_mutant(mutant: Mutant, timeout: float) -> Outcome:
    """Killed by the focused pass, else by the full run, else survived."""
    passes: list[tuple[tuple[str, ...], float]] = []
    if mutant.first_pass is not None:
        quick = mutant.first_pass == QUICK.get(mutant.name.split(":", maxsplit=1)[0])
        passes.append((mutant.first_pass, min(timeout, QUICK_TIMEOUT) if quick else timeout))
    passes.append((mutant.tests, timeout))
    spent = 0.0
    with tempfile.TemporaryDirectory(prefix="trioindex-mutant-") as folder:
        parent = Path(folder)
        package = _copy_package(parent)
        (package / mutant.path).write_text(mutated_source(mutant))
        for number, (arguments, limit) in enumerate(passes, 1):
            code, output, seconds = run_tests(parent, arguments, limit)
            spent += seconds
            if code == 0 or (code == 5 and number < len(passes)):  # 5: none selected
                continue
            if code is None:
                return Outcome(mutant, "timeout", f"(hung: no result within {limit:.0f}s)", spent)
            failed = _FAILED_LINE.search(output)
            if code == 1 and failed:
                return Outcome(mutant, "killed", failed.group(1), spent)
            tail = output.strip().splitlines()[-1:] or ["(no output)"]
            return Outcome(mutant, "error", f"pytest exit {code}: {tail[0][:120]}", spent)
    return Outcome(mutant, "survived", "", spent)


def baseline(timeout: float) -> None:
    """The unmutated copy must pass every test file the catalogue uses, or nothing is learnt."""
    files = sorted({t for m in CATALOGUE for t in m.tests})
    with tempfile.TemporaryDirectory(prefix="trioindex-mutant-") as folder:
        parent = Path(folder)
        _copy_package(parent)
        if not _imports_from(parent):
            raise SystemExit("PYTHONPATH does not win over the installed trioindex; stopping")
        code, output, seconds = run_tests(parent, files, timeout)
    if code != 0:
        print(output[-3000:])
        raise SystemExit(f"the unmutated code fails its own tests (exit {code}); stopping")
    print(f"baseline: {' '.join(files)} pass on the unmutated copy ({seconds:.0f}s)")


# ---------------------------------------------------------------------------------------------
# report


def _verdict(outcome: Outcome) -> str:
    equivalent = outcome.mutant.equivalent
    if outcome.result in ("killed", "timeout"):
        verdict = "killed" if outcome.result == "killed" else "killed (timeout)"
        return f"**{verdict} — but listed as equivalent: wrong claim**" if equivalent else verdict
    if outcome.result == "survived":
        return "equivalent" if equivalent else "**survived**"
    return f"**error** {outcome.killed_by}"


HOW_TO_READ = (
    "*killed*: a test failed (the first one is named). *killed (timeout)*: the tests hung; "
    "the runtime's fake-clock tests, which take about a second, are given "
    f"{QUICK_TIMEOUT:.0f} s. *equivalent*: survived, and cannot change behaviour (reasons "
    "below); a mutant listed as equivalent that is killed would be flagged. The last column "
    "is the seconds to the verdict, focused and full passes together, with two mutants run at "
    "once and other work sharing the machine (the load average above).",
)


def render(outcomes: Sequence[Outcome], *, command: str, machine: list[str], took: float) -> str:
    counts = {
        key: sum(1 for o in outcomes if _verdict(o).startswith(key))
        for key in ("killed", "equivalent", "**survived**", "**error**")
    }
    lines = [
        "# Mutation pass",
        "",
        "Generated by `bench/mutants.py` (see its docstring for how mutants are applied and why "
        "the list is curated). Each mutant is one text change to a copy of `src/trioindex`; its "
        "test files run against the copy with `pytest -x`.",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Wall time: {took / 60:.1f} min",
        "",
        *[f"* {line}" for line in machine],
        "",
        f"**{len(outcomes)} mutants: {counts['killed']} killed, {counts['equivalent']} "
        f"equivalent, {counts['**survived**']} survived, {counts['**error**']} errors.**",
        "",
        *HOW_TO_READ,
        "",
        "| # | area | mutant | file | verdict | first failing test | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, outcome in enumerate(outcomes, 1):
        mutant = outcome.mutant
        test = outcome.killed_by.replace("|", "\\|")
        lines.append(
            f"| {number} | {mutant.area} | {mutant.name} | `{mutant.path}` | "
            f"{_verdict(outcome)} | {f'`{test}`' if outcome.result == 'killed' else test} | "
            f"{outcome.seconds:.0f} |"
        )
    equivalents = [o.mutant for o in outcomes if o.mutant.equivalent]
    if equivalents:
        lines += ["", "## Why the equivalent mutants are equivalent", ""]
        lines += [f"* **{m.name}**: {m.equivalent}." for m in equivalents]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.mutants", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check the catalogue applies")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--only", action="append", default=[], help="mutants whose name has this")
    parser.add_argument("--skip-equivalent", action="store_true")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant")
    parser.add_argument("--output", type=Path, default=RESULT_PAGE)
    parser.add_argument("--no-write", action="store_true", help="print the page, do not write it")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problems = check_catalogue()
    if problems:
        print("\n".join(problems))
        return 2
    selected = [
        m
        for m in CATALOGUE
        if (not args.only or any(part in m.name for part in args.only))
        and not (args.skip_equivalent and m.equivalent)
    ]
    if args.check or args.list:
        for mutant in selected if args.list else []:
            print(f"{mutant.area:13} {mutant.name}{'  (equivalent)' if mutant.equivalent else ''}")
        print(f"{len(CATALOGUE)} mutants, each matching its file once")
        return 0
    from bench.common import format_machine, machine_info  # numpy/psutil: only for a run

    started = time.monotonic()
    baseline(args.timeout * 2)
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for outcome in pool.map(lambda m: try_mutant(m, args.timeout), selected):
            print(
                f"{_verdict(outcome):12} {outcome.seconds:5.0f}s  {outcome.mutant.name}  {outcome.killed_by}"
            )
            outcomes.append(outcome)
    took = time.monotonic() - started
    command = "just mutants" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    page = render(outcomes, command=command, machine=format_machine(machine_info()), took=took)
    if args.no_write:
        print(page)
    else:
        args.output.write_text(page)
        print(f"wrote {args.output.relative_to(REPO_ROOT)}")
    bad = [o for o in outcomes if _verdict(o).startswith("**")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
