"""Random interleavings of the public operations on one real PostgreSQL per example
(docs/test-results/interleavings.md).

A hypothesis state machine drives ingest (new, changed and unchanged bytes of a few keys, one
file or the whole folder, with or without ``--sync``), deletes by key and by prefix, model
activation and removal, ``jobs retry``, and the worker's steps for two models A (serving
first) and B, one job at a time, through the functions the worker itself calls (``db.jobs``
and ``db.steps``): claim, parse (prepare, then the chunk set), embed (prepare, then the vectors
in one or two slices, the last completing the job), a transient or final failure, a crash
(lease expired, then recovered) and the shutdown hand-back; and a drain that runs every open
job to its end. Claims stay in the machine after their job moved on, so a step may run on a
stale claim: it must be refused and change nothing.

After every step the invariants are checked with SQL reads and the real search functions
(``Interleavings.consistent``): (1) search returns exactly the chunks of the versions the
serving model serves, each with one vector per chunk; (2) no served version moves backwards;
(3) no document is served at an older version than before, across a switch too; (4) a
SUCCEEDED job's set has one vector per chunk, ``chunk_count`` of them; (5) attempts are
numbered 1..n with at most one STARTED; (6) after a drain nothing is open; (7) every version's
blob is in the store; (8) each model serves the newest version it completed; and the machine's
idea of which claims own their jobs is the fence's.

``just test`` runs a small fixed-seed budget; ``just fuzz --steps N --examples M [--seed S]``
a longer one (TRIOINDEX_FUZZ_STEPS, TRIOINDEX_FUZZ_EXAMPLES, TRIOINDEX_FUZZ_SEED).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

import attrs
import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from testkit.embed_server import fake_vector
from testkit.postgres import fresh_database
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import (
    EmbeddingModel,
    activate_model,
    ensure_model,
    remove_model,
    serving_model,
)
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import (
    ChunkCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    begin_embedding,
    store_chunks_many,
    store_embeddings_many,
)
from trioindex.errors import (
    FailureType,
    ModelRemoved,
    NotFound,
    OwnershipLost,
    StorageUnavailable,
    TrioindexError,
)
from trioindex.ingest import ingest_paths
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.pipeline.embed_step import drafts_from_matrix
from trioindex.removal import delete_documents
from trioindex.search.ranking import fuse, text_ranking, vector_ranking
from trioindex.search.results import RankedChunk
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import CHARACTER_CHUNKING, BackoffPolicy, Claim, ParseSnapshot, token_chunking

# -- the world ----------------------------------------------------------------------------------

KEYS = ("docs/a.txt", "docs/b.txt", "docs/sub/c.txt", "docs/sub/d.txt")
PREFIXES = ("docs/sub/", "docs/")
# a file's bytes (equal texts make unchanged ingests and versions sharing a blob), and the
# words searched for (every text has one, not every chunk)
TEXTS = ("alpha bravo charlie delta", "echo foxtrot", "golf hotel alpha echo bravo", "delta")
QUERY = "alpha delta foxtrot"
MODELS = ("A", "B")
DIMENSION = 4
LEASE_SECONDS = 300.0
MAX_ATTEMPTS = 2
ZERO_BACKOFF = BackoffPolicy(initial=0.0, maximum=0.0, jitter=0.0)
FAILURES = (FailureType.EMBEDDING_PROVIDER_UNAVAILABLE, FailureType.DOCUMENT_CONTENT_INVALID)
# What happens next: a worker's move or an operator's command, weighted by repetition (the
# first that applies is what shrinking goes to).
ACTIONS = (
    *("advance",) * 4,
    *("claim",) * 4,
    *("fail",) * 3,
    "crash",
    "release",
    "stale",
    *("ingest_file",) * 2,
    "ingest_folder",
    "edit_file",
    "delete",
    *("models_activate",) * 2,
    "models_remove",
    "jobs_retry",
)
# steps between two drains at least (a drain ends every open job: the interleavings are
# what happens between them)
DRAIN_EVERY = 15
SEARCH_LIMIT = 10_000
DRAIN_STEPS = 400

# The budget: `just test` runs EXAMPLES examples of up to STEPS steps from DEFAULT_SEED (about
# 300 checked states, 10-15 s on 2 cores); `just fuzz` sets TRIOINDEX_FUZZ_STEPS and
# TRIOINDEX_FUZZ_EXAMPLES, and TRIOINDEX_FUZZ_SEED or else a new seed (printed with the figures).
_FUZZ = "TRIOINDEX_FUZZ_STEPS" in os.environ or "TRIOINDEX_FUZZ_EXAMPLES" in os.environ
STEPS = int(os.environ.get("TRIOINDEX_FUZZ_STEPS", "30"))
EXAMPLES = int(os.environ.get("TRIOINDEX_FUZZ_EXAMPLES", "10"))
DEFAULT_SEED = 26
SEED = int(
    os.environ.get("TRIOINDEX_FUZZ_SEED") or (random.randrange(2**32) if _FUZZ else DEFAULT_SEED)
)


def _chunk_texts(text: str, chunking: str) -> list[str]:
    """The worker's chunker, reduced: two words a chunk for character chunks, three for a
    model's token-aware set (so the two sets of a version differ)."""
    words = text.split()
    size = 2 if chunking == CHARACTER_CHUNKING else 3
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)]


def _drafts(texts: Sequence[str]) -> list[ChunkDraft]:
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
        start += len(text) + 1
    return drafts


def _vectors(snapshot: EmbedSnapshot) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The vectors of the snapshot's chunks, deterministic from their text."""
    return np.asarray(
        [fake_vector(chunk.text, snapshot.dimension) for chunk in snapshot.chunks],
        dtype=np.float32,
    ).reshape(len(snapshot.chunks), snapshot.dimension)


# -- a held claim -------------------------------------------------------------------------------


@attrs.define(eq=False)
class Held:
    """A claim as the worker holding it sees it: where its job's pipeline is, and whether the
    machine expects it to still own the job (checked against the job row after every step)."""

    claim: Claim = attrs.field(repr=False)
    model: str
    label: str
    document_id: UUID = attrs.field(repr=False)
    live: bool = True
    stage: str = "parse"  # parse, commit, embed, store, complete, done
    parse: ParseSnapshot | None = attrs.field(default=None, repr=False)
    text: str | None = attrs.field(default=None, repr=False)
    embed: EmbedSnapshot | None = attrs.field(default=None, repr=False)
    offset: int = 0

    def __repr__(self) -> str:
        return self.label


class Refused(Exception):
    """A step of a live claim that was refused (a hole, unless the machine's model is wrong)."""


# -- reads --------------------------------------------------------------------------------------

_DIGEST_TABLES = (
    "documents",
    "document_versions",
    "document_chunks",
    "embeddings",
    "embedding_jobs",
    "embedding_job_attempts",
    "served_versions",
    "embedding_models",
    "indexing_events",
)


def _digest(conn: Connection) -> dict[str, str]:
    """Every row of the tables a step may write, hashed per table: a refused step must leave
    all of them as they were."""
    parts = ", ".join(
        f"(SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} t)"
        f" AS {table}"
        for table in _DIGEST_TABLES
    )
    row = conn.execute(f"SELECT {parts}").fetchone()
    assert row is not None
    return dict(row)


_JOB_LABELS = """
SELECT j.id, j.status, d.external_key || '@' || v.version_no || '/' || m.name AS label
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN documents d ON d.id = v.document_id
JOIN embedding_models m ON m.id = j.embedding_model_id
"""


def _labels(conn: Connection, where: str, *params: object) -> dict[str, UUID]:
    """Jobs by a label that does not depend on random ids (so draws replay): key@version/model."""
    rows = conn.execute(f"{_JOB_LABELS} WHERE {where}", params).fetchall()
    return {row["label"]: row["id"] for row in rows}


def _owned(conn: Connection, claims: Sequence[Claim]) -> list[bool]:
    """Whether each claim owns its job now (what the fence checks), in one read."""
    if not claims:
        return []
    rows = conn.execute(
        """SELECT EXISTS (
                  SELECT 1 FROM embedding_jobs j
                  WHERE j.id = c.job AND j.status = 'PROCESSING' AND j.worker_id = c.worker
                    AND j.claim_token = c.token AND j.lease_expires_at > clock_timestamp()
                    AND j.attempt_id = c.attempt) AS owned
           FROM unnest(%s::uuid[], %s::uuid[], %s::uuid[], %s::uuid[]) WITH ORDINALITY
                AS c(job, worker, token, attempt, n)
           ORDER BY c.n""",
        (
            [c.job_id for c in claims],
            [c.worker_id for c in claims],
            [c.claim_token for c in claims],
            [c.attempt_id for c in claims],
        ),
    ).fetchall()
    return [row["owned"] for row in rows]


# Every served version, with its job and what its chunk set and vectors hold.
_SERVED_SQL = """
SELECT s.document_id, s.embedding_model_id AS model_id, m.name AS model, d.external_key,
       v.id AS version_id, v.version_no, v.document_id AS version_document,
       j.status AS job_status, j.chunk_count, j.chunking,
       (SELECT count(*) FROM document_chunks c
         WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS chunks,
       (SELECT count(*) FROM embeddings e
         WHERE e.document_version_id = v.id AND e.embedding_model_id = m.id) AS vectors,
       (SELECT count(DISTINCT e.chunk_id) FROM embeddings e
          JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
         WHERE e.document_version_id = v.id AND e.embedding_model_id = m.id) AS matched
FROM served_versions s
JOIN embedding_models m ON m.id = s.embedding_model_id
JOIN documents d ON d.id = s.document_id
JOIN document_versions v ON v.id = s.document_version_id
LEFT JOIN embedding_jobs j ON j.document_version_id = v.id AND j.embedding_model_id = m.id
"""

# Every SUCCEEDED job, with what its chunk set and its model's vectors on it hold.
_SUCCEEDED_SQL = """
SELECT d.external_key || '@' || v.version_no || '/' || m.name AS label, j.chunk_count,
       (SELECT count(*) FROM document_chunks c
         WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS chunks,
       (SELECT count(*) FROM embeddings e
         WHERE e.document_version_id = v.id AND e.embedding_model_id = m.id) AS vectors,
       (SELECT count(DISTINCT e.chunk_id) FROM embeddings e
          JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
         WHERE e.document_version_id = v.id AND e.embedding_model_id = m.id) AS matched
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN documents d ON d.id = v.document_id
JOIN embedding_models m ON m.id = j.embedding_model_id
WHERE j.status = 'SUCCEEDED'
"""

_ATTEMPTS_SQL = """
SELECT j.id, j.status, j.attempt_count,
       d.external_key || '@' || v.version_no || '/' || m.name AS label,
       coalesce(array_agg(a.attempt_no ORDER BY a.attempt_no)
                FILTER (WHERE a.id IS NOT NULL), '{}') AS numbers,
       count(a.id) FILTER (WHERE a.status = 'STARTED') AS started,
       max(a.attempt_no) FILTER (WHERE a.status = 'STARTED') AS started_no,
       (array_agg(a.status ORDER BY a.attempt_no DESC))[1] AS last_status
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN documents d ON d.id = v.document_id
JOIN embedding_models m ON m.id = j.embedding_model_id
LEFT JOIN trioindex_job_attempts a ON a.embedding_job_id = j.id
GROUP BY j.id, d.external_key, v.version_no, m.name
"""

# The newest version each model completed, per document (what it must serve).
_NEWEST_DONE_SQL = """
SELECT v.document_id, j.embedding_model_id AS model_id, max(v.version_no) AS version_no
FROM embedding_jobs j JOIN document_versions v ON v.id = j.document_version_id
WHERE j.status = 'SUCCEEDED'
GROUP BY v.document_id, j.embedding_model_id
"""


def _served(conn: Connection) -> list[dict[str, Any]]:
    return conn.execute(_SERVED_SQL).fetchall()


def _active_id(conn: Connection) -> UUID | None:
    """The serving model's id as the row says now (without ending a switch)."""
    row = conn.execute("SELECT id FROM embedding_models WHERE is_active").fetchone()
    return None if row is None else row["id"]


# -- the machine --------------------------------------------------------------------------------


class Interleavings(RuleBasedStateMachine):
    """One fresh database (from the migrated template), one folder of files and one folder
    store per example; models A (serving first) and B; one worker row per model."""

    server_url: ClassVar[str] = ""
    template: ClassVar[str] = ""
    # the progress invariant (8): TRIOINDEX_FUZZ_SKIP=8 turns it off, to show what the other
    # invariants catch alone (bench/holes.toml)
    check_progress: ClassVar[bool] = "8" not in os.environ.get("TRIOINDEX_FUZZ_SKIP", "").split(",")
    # examples run (hypothesis's own count leaves out the ones it rejected), rules run (steps),
    # and states checked (after every step and once at the start of each example)
    examples_run: ClassVar[int] = 0
    steps_run: ClassVar[int] = 0
    checks_run: ClassVar[int] = 0
    # what the runs did, for `just fuzz`'s summary
    tally: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        type(self).examples_run += 1
        self._stack = contextlib.ExitStack()
        url = self._stack.enter_context(
            fresh_database(self.server_url, "trioindex_fuzz", self.template)
        )
        self.db = Database(url, pool_size=3)
        self.db.open()
        self._stack.callback(self.db.close)
        self.root = Path(tempfile.mkdtemp(prefix="trioindex-fuzz-"))
        self._stack.callback(shutil.rmtree, self.root, ignore_errors=True)
        self.folder = self.root / "docs"
        self.folder.mkdir()
        self.store = FolderStore(self.root / "blobs")
        self.store.ensure_ready()
        with self.db.connection() as conn:
            self.model_ids = {name: ensure_model(conn, name, DIMENSION).id for name in MODELS}
        self.present = set(MODELS)
        self.workers: dict[str, UUID] = {}
        self.chunkings: dict[str, str] = {}
        self.helds: list[Held] = []
        # whether a job may be open (the drain has work) or FAILED (retry has a job)
        self.dirty = self.failed = False
        self.since_drain = 0
        self.keys: set[str] = set()
        # per (document, model): the version_no it served at the last check
        self.last_served: dict[tuple[UUID, UUID], int] = {}
        # what search served at the last check: the model, and per document its version_no
        self.last_serving: UUID | None = self.model_ids["A"]
        self.last_search: dict[UUID, int] = {}

    def teardown(self) -> None:
        self._stack.close()

    def _note(self, what: str) -> None:
        type(self).tally[what] += 1

    # -- helpers ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Connection]:
        with self.db.connection() as conn:
            yield conn

    def _trio(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """An async operation in its own Trio run (the folder store's limiter made in it)."""

        async def main() -> Any:
            store = AsyncObjectStore(self.store, trio.CapacityLimiter(2))
            return await fn(*args, store=store, **kwargs)

        return trio.run(main)

    def _forget_deleted(self) -> None:
        """Claims on documents that are gone lost their jobs with them; ``keys``: the stored
        documents' keys."""
        with self._conn() as conn:
            rows = conn.execute("SELECT id, external_key FROM documents").fetchall()
        ids = {row["id"] for row in rows}
        self.keys = {row["external_key"] for row in rows}
        for held in self.helds:
            if held.document_id not in ids:
                held.live = False

    def _hold(self, conn: Connection, claim: Claim, model: str) -> Held:
        row = conn.execute(
            """SELECT v.document_id, d.external_key || '@' || v.version_no AS label
               FROM document_versions v JOIN documents d ON d.id = v.document_id
               WHERE v.id = %s""",
            (claim.document_version_id,),
        ).fetchone()
        assert row is not None
        held = Held(
            claim,
            model,
            f"#{len(self.helds)} {row['label']}/{model} attempt {claim.attempt_no}",
            row["document_id"],
            stage="embed" if claim.chunks_ready else "parse",
        )
        self.helds.append(held)
        return held

    # -- files and ingest -------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.folder / key.removeprefix("docs/")

    def _write(self, key: str, text: str | None) -> None:
        path = self._path(key)
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def _ingest(self, paths: list[Path], model: str, **options: Any) -> list[str]:
        """``ingest PATHS`` configured with ``model`` (registered if it was removed)."""
        if model not in self.present:
            with self._conn() as conn:
                self.model_ids[model] = ensure_model(conn, model, DIMENSION).id
            self.present.add(model)
        entries = self._trio(
            functools.partial(ingest_paths, db=self.db, model_id=self.model_ids[model]),
            paths,
            max_attempts=MAX_ATTEMPTS,
            **options,
        )
        statuses = [str(getattr(e, "status", e)) for e in entries]
        for status in statuses:
            self._note(f"ingest: {status}")
        self.dirty = True
        self._forget_deleted()
        return statuses

    @initialize(
        tokens=st.booleans(),
        files=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(TEXTS), max_size=len(KEYS)),
        switch=st.booleans(),
    )
    def start(self, tokens: bool, files: dict[str, str], switch: bool) -> None:
        """One worker row per model (B's chunks its own token-aware set, or the character set
        every model shares); ``files`` written and ingested (``ingest docs/ --as docs``);
        ``switch``: then ``models activate B``."""
        self.chunkings = {
            "A": CHARACTER_CHUNKING,
            "B": token_chunking("B") if tokens else CHARACTER_CHUNKING,
        }
        with self._conn() as conn:
            self.workers = {
                name: helpers.worker(conn, chunking=self.chunkings[name]) for name in MODELS
            }
        for key, text in sorted(files.items()):
            self._write(key, text)
        if files:
            assert self._ingest([self.folder], "A", key_as="docs") == ["created"] * len(files)
        if switch:
            self._activate("B")

    def _edit_file(self, data: st.DataObject) -> None:
        """Change, create (or with None remove) a file in the folder without ingesting it."""
        key = data.draw(st.sampled_from(KEYS), label="key")
        self._write(key, data.draw(st.none() | st.sampled_from(TEXTS), label="text"))

    def _ingest_file(self, data: st.DataObject) -> None:
        """Write a file and ingest it alone (``ingest FILE --as KEY``) configured with a
        model: new, changed or unchanged bytes."""
        key = data.draw(st.sampled_from(KEYS), label="key")
        self._write(key, data.draw(st.sampled_from(TEXTS), label="text"))
        model = data.draw(st.sampled_from(MODELS), label="model")
        statuses = self._ingest([self._path(key)], model, key_as=key)
        assert statuses in (["created"], ["unchanged"]), statuses

    def _ingest_folder(self, data: st.DataObject) -> None:
        """``ingest docs/ --as docs`` configured with a model (``--sync``: documents whose
        files are gone are deleted)."""
        model = data.draw(st.sampled_from(MODELS), label="model")
        sync = data.draw(st.booleans(), label="sync")
        statuses = self._ingest([self.folder], model, key_as="docs", sync=sync)
        assert set(statuses) <= {"created", "unchanged", "deleted"}, statuses
        if sync:
            self._forget_deleted()
            on_disk = {k for k in KEYS if self._path(k).exists()}
            with self._conn() as conn:
                stored = {
                    r["external_key"] for r in conn.execute("SELECT external_key FROM documents")
                }
            assert stored == on_disk, (stored, on_disk)

    # -- deletes ----------------------------------------------------------------------------

    def _delete(self, data: st.DataObject) -> None:
        """``delete KEY`` of a stored document, or ``delete --prefix`` of a folder holding one."""
        names = sorted(self.keys) + [p for p in PREFIXES if any(k.startswith(p) for k in self.keys)]
        what = data.draw(st.sampled_from(names), label="delete")
        if what.endswith("/"):
            report = self._trio(functools.partial(delete_documents, self.db), prefix=what)
        else:
            report = self._trio(functools.partial(delete_documents, self.db), keys=[what])
        assert report.blobs_left == 0
        self._note(f"deleted documents ({len(report.deleted)})")
        self._forget_deleted()
        with self._conn() as conn:
            left = helpers.count(
                conn,
                "SELECT count(*) FROM documents WHERE external_key = %s"
                " OR (right(%s, 1) = '/' AND starts_with(external_key, %s))",
                what,
                what,
                what,
            )
            assert left == 0, f"{what} still stored after its delete"

    # -- models -----------------------------------------------------------------------------

    def _models_activate(self, data: st.DataObject) -> None:
        self._activate(data.draw(st.sampled_from(MODELS), label="name"))

    def _models_remove(self, data: st.DataObject) -> None:
        self._remove(data.draw(st.sampled_from(MODELS), label="name"))

    def _activate(self, name: str) -> None:
        """``models activate NAME``: refused while a switch to the other model runs."""
        with self._conn() as conn:
            other = conn.execute(
                "SELECT name FROM embedding_models WHERE activating AND name <> %s", (name,)
            ).fetchone()
            serving = _active_id(conn) == self.model_ids[name] and name in self.present
            try:
                activation = activate_model(conn, name, DIMENSION, max_attempts=MAX_ATTEMPTS)
            except TrioindexError as exc:
                assert other is not None and not serving, f"activating {name} refused: {exc}"
                assert "in progress" in str(exc)
                self._note("activate: refused (a switch runs)")
                return
            assert other is None or serving, f"activated {name} during the switch to {other}"
        self._note("activate")
        self.model_ids[name] = activation.model.id
        self.present.add(name)
        self.dirty = True

    def _remove(self, name: str) -> None:
        """``models remove NAME``: refused for the serving model."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT id, is_active FROM embedding_models WHERE name = %s", (name,)
            ).fetchone()
            try:
                remove_model(conn, name)
            except NotFound:
                assert row is None, f"{name} exists but removing it said it does not"
                self._note("remove: not found")
                return
            except TrioindexError as exc:
                assert row is not None and row["is_active"], f"removing {name} refused: {exc}"
                self._note("remove: refused (serving)")
                return
            assert row is not None and not row["is_active"], f"removed {name} while serving"
        self._note("model removed")
        self.present.discard(name)
        for held in self.helds:
            if held.claim.embedding_model_id == row["id"]:
                held.live = False

    # -- operator retry ---------------------------------------------------------------------

    def _jobs_retry(self, data: st.DataObject) -> None:
        """``jobs retry`` of a FAILED job."""
        with self._conn() as conn:
            failed = _labels(conn, "j.status = 'FAILED'")
            if not failed:
                self.failed = False
                return
            label = data.draw(st.sampled_from(sorted(failed)), label="failed job")
            lifecycle.retry_failed(conn, failed[label], extra_attempts=MAX_ATTEMPTS)
            assert helpers.job_row(conn, failed[label])["status"] == "PENDING"
        self._note("jobs retry")
        self.dirty = True

    # -- the worker's steps -----------------------------------------------------------------

    def _claim_job(self, model: str, pick: Callable[[list[str]], str]) -> Held | None:
        """A worker of ``model`` claims one job: the one ``pick`` chooses among those it may
        claim, by label (the others held by a second connection, as a concurrent claimer
        would, so SKIP LOCKED passes them by: which job a claim gets never depends on random
        ids, and a draw replays)."""
        model_id = self.model_ids[model]
        with self._conn() as conn, self._conn() as other:
            candidates = _labels(
                conn,
                "j.status = 'PENDING' AND j.available_at <= now() AND j.embedding_model_id = %s",
                model_id,
            )
            target = pick(sorted(candidates)) if candidates else None
            with other.transaction():
                others = [job for label, job in candidates.items() if label != target]
                other.execute(
                    "SELECT id FROM embedding_jobs WHERE id = ANY(%s) FOR UPDATE", (others,)
                )
                try:
                    claimed = lifecycle.claim_jobs(
                        conn, self.workers[model], 1, LEASE_SECONDS, model_id=model_id
                    )
                except ModelRemoved:
                    assert model not in self.present, f"{model} exists, the claim says removed"
                    return None
            assert model in self.present, f"{model} was removed, the claim did not say so"
            if target is None:
                assert claimed == [], f"claimed {claimed} with nothing claimable"
                return None
            assert [c.job_id for c in claimed] == [candidates[target]], (target, claimed)
            self._note("claim")
            self.dirty = True
            return self._hold(conn, claimed[0], model)

    def _claim(self, data: st.DataObject) -> None:
        """A worker of a model claims the job drawn among those it may claim, and its first
        steps succeed."""
        model = data.draw(st.sampled_from(MODELS), label="model")
        held = self._claim_job(
            model, lambda labels: data.draw(st.sampled_from(labels), label="job")
        )
        if held is not None:
            self._steps(held, data.draw(st.integers(0, 1), label="steps"))

    def _pick(self, data: st.DataObject, live: bool) -> Held:
        """A held claim drawn by its label: one the machine expects to own its job, or a
        stale one."""
        held = {h.label: h for h in self.helds if h.live == live}
        return held[data.draw(st.sampled_from(sorted(held)), label="claim")]

    def _step(self, conn: Connection, held: Held, split: bool) -> None:
        """The next step of the held claim's pipeline, as the worker runs it; raises what
        refused it."""
        claim = held.claim
        if held.stage == "parse":
            # the claim carries what the parse reads: no transaction before the chunk commit
            begun = claim.parse
            assert begun is not None
            held.parse = begun
            try:
                held.text = self.store.get(begun.storage_key, max_bytes=1 << 20).decode()
            except StorageUnavailable as exc:
                if held.live:
                    raise
                # a stale claim's document may be deleted with its stored copy: the worker
                # reports the read's failure, and that report is what the fence refuses
                lifecycle.fail_job(
                    conn, claim, exc.failure_type, "injected", ZERO_BACKOFF, unit_random=0.5
                )
                raise AssertionError(f"the failure report of stale {held!r} was taken") from exc
            held.stage = "commit"
            if not held.live:
                # nothing refuses a read; the stale claim's worker goes on to its chunk commit
                self._step(conn, held, split)
        elif held.stage == "commit":
            assert held.parse is not None and held.text is not None
            chunks = _drafts(_chunk_texts(held.text, claim.chunking))
            with conn.transaction():
                (stored,) = store_chunks_many(conn, [ChunkCommit(claim, held.parse, chunks)])
            if isinstance(stored, Exception):
                raise stored
            if isinstance(stored, int):  # stored already: the embed step prepares itself
                self._note("chunk commit found the set stored")
                held.stage = "embed"
            else:
                self._note("chunk set stored")
                held.embed, held.offset, held.stage = stored, 0, "store"
        elif held.stage == "embed":
            snapshot = begin_embedding(conn, claim)
            held.embed, held.offset = snapshot, 0
            held.stage = "complete" if snapshot.complete else "store"
        elif held.stage == "store":
            embed = held.embed
            assert embed is not None
            drafts = drafts_from_matrix(embed, _vectors(embed))
            left = len(drafts) - held.offset
            size = left // 2 if split and left >= 2 else left
            piece = EmbeddingCommit(
                claim, embed, drafts[held.offset : held.offset + size], held.offset
            )
            with conn.transaction():
                (result,) = store_embeddings_many(conn, [piece])
            if isinstance(result, Exception):
                raise result
            held.offset += size
            if result.result is not None:
                self._note("job completed")
                held.stage, held.live = "done", False
            else:
                self._note("partial vector slice stored")
                assert held.offset < len(drafts), "the last slice did not complete the job"
        elif held.stage in ("complete", "done"):
            lifecycle.complete_job(conn, claim)  # a replayed embed step: only completion left
            self._note("job completed (replayed set)")
            held.stage, held.live = "done", False
        else:
            raise AssertionError(held.stage)

    def _crash(self, conn: Connection, held: Held) -> None:
        """The worker holding the claim dies: its lease runs out and recovery requeues (or
        fails) the job. A stale claim's worker dying changes nothing."""
        if held.live:
            helpers.expire_lease(conn, held.claim.job_id)
        recovered = lifecycle.recover_expired(conn, ZERO_BACKOFF)
        if held.live:
            assert [r.job_id for r in recovered] == [held.claim.job_id], recovered
            held.live = False
            self._note(f"crash: {recovered[0].outcome.value}")
        else:
            assert recovered == [], recovered
            raise OwnershipLost("(a stale claim's worker crashed: nothing to recover)")

    def _act(self, held: Held, action: Callable[[Connection], None]) -> None:
        """``action`` on the held claim: a live claim must not be refused; a stale one must be
        refused (OwnershipLost, or JobRemoved once the job is gone) and change nothing."""
        with self._conn() as conn:
            before = None if held.live else _digest(conn)
            try:
                action(conn)
            except OwnershipLost as exc:
                if held.live:
                    raise Refused(f"{held!r} (live) refused: {exc}") from exc
                assert _digest(conn) == before, f"a refused step of {held!r} changed rows"
                self._note("stale claim refused")
                return
            except TrioindexError as exc:
                state = "live" if held.live else "stale"
                raise Refused(f"{held!r} ({state}): {exc!r}") from exc
            assert before is None, f"a stale claim {held!r} was not refused"

    def _advance(self, held: Held, half: bool) -> None:
        self._act(held, lambda conn: self._step(conn, held, split=half))

    def _fail(self, held: Held, for_good: bool) -> None:
        def action(conn: Connection) -> None:
            result = lifecycle.fail_job(
                conn, held.claim, FAILURES[for_good], "injected", ZERO_BACKOFF, unit_random=0.5
            )
            held.live = False
            self._note(f"failure: {result.outcome.value}")

        self._act(held, action)
        self.dirty = self.failed = True

    def _release(self, held: Held) -> None:
        def action(conn: Connection) -> None:
            lifecycle.release_job(conn, held.claim)
            held.live = False
            self._note("claim released")

        self._act(held, action)
        self.dirty = True

    def _steps(self, held: Held, steps: int, half: bool = False) -> None:
        """Up to ``steps`` successful steps of the claim (fewer when its job completes)."""
        for _ in range(steps):
            if not held.live:
                return
            self._advance(held, half)

    def _advance_rule(self, data: st.DataObject) -> None:
        """A claim's next steps succeed (``half``: each vector slice stores half of the
        vectors left, as the slices of a large document do)."""
        held = self._pick(data, live=True)
        steps = data.draw(st.integers(1, 4), label="steps")
        self._steps(held, steps, data.draw(st.booleans(), label="half"))

    def _pick_after(self, data: st.DataObject) -> Held:
        """A live claim, after ``after`` successful steps of it (vector slices of half)."""
        held = self._pick(data, live=True)
        self._steps(held, data.draw(st.integers(0, 3), label="after"), half=True)
        return held

    def _fail_rule(self, data: st.DataObject) -> None:
        """After some successful steps a claim's step fails: transiently (retried while
        attempts are left) or for good."""
        held = self._pick_after(data)
        self._fail(held, data.draw(st.booleans(), label="for good"))

    def _crash_rule(self, data: st.DataObject) -> None:
        """After some successful steps the worker holding a claim dies: its lease runs out and
        recovery requeues the job (or fails it, on the last attempt)."""
        held = self._pick_after(data)
        self._act(held, lambda conn: self._crash(conn, held))
        self.dirty = self.failed = True

    def _release_rule(self, data: st.DataObject) -> None:
        """After some successful steps a claim is handed back unfinished (shutdown)."""
        self._release(self._pick_after(data))

    def _stale_rule(self, data: st.DataObject) -> None:
        """A worker whose claim no longer owns its job (finished, failed, recovered, handed
        back, or its document or model removed) goes on: refused, and nothing changes."""
        held = self._pick(data, live=False)
        action = data.draw(st.sampled_from(("advance", "fail", "crash", "release")), label="do")
        if action == "advance":
            self._advance(held, half=False)
        elif action == "fail":
            self._fail(held, for_good=True)
        elif action == "crash":
            self._act(held, lambda conn: self._crash(conn, held))
        else:
            self._release(held)

    # -- the rules --------------------------------------------------------------------------
    #
    # One rule draws what happens next from a weighted list, among the actions that apply
    # now: hypothesis picks among rules evenly and turns some of them off in each example
    # ("swarm testing"), which with a rule per action made the worker's moves rare and left
    # many examples with no worker or no operator at all.

    def _applies(self, action: str) -> bool:
        if action in ("advance", "fail", "crash", "release"):
            return any(h.live for h in self.helds)
        if action == "stale":
            return any(not h.live for h in self.helds)
        if action == "delete":
            return bool(self.keys)
        if action == "jobs_retry":
            return self.failed
        if action == "claim":  # some worker has a job to claim (one of the two may not)
            with self._conn() as conn:
                return bool(_labels(conn, "j.status = 'PENDING' AND j.available_at <= now()"))
        return True

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """A worker's move (claim a job and run its first steps, run a live claim's next
        steps, fail one, crash or hand one back, go on with a stale claim) or an operator's
        command (ingest a file or the folder, maybe ``--sync``; edit the folder; delete;
        ``models activate`` / ``models remove``; ``jobs retry``)."""
        type(self).steps_run += 1
        applicable = [a for a in ACTIONS if self._applies(a)]
        action = data.draw(st.sampled_from(applicable), label="action")
        self._note(f"action {action}")
        method = getattr(self, f"_{action}_rule", None) or getattr(self, f"_{action}")
        method(data)

    @precondition(lambda self: self.dirty and self.since_drain >= DRAIN_EVERY)
    @rule()
    def drain(self) -> None:
        """Every open job of both models run to the end with successful steps (bounded):
        afterwards nothing is PENDING or PROCESSING, and a switch whose model owes nothing and
        failed nothing has ended."""
        type(self).steps_run += 1
        refused: list[str] = []
        budget = DRAIN_STEPS

        def run(held: Held) -> None:
            nonlocal budget
            with self._conn() as conn:
                while held.live and budget > 0:
                    budget -= 1
                    try:
                        self._step(conn, held, split=False)
                    except TrioindexError as exc:
                        refused.append(f"{held!r}: {exc}")
                        return

        for held in [h for h in self.helds if h.live]:
            run(held)
        for name in MODELS:
            while name in self.present and budget > 0:
                claimed = self._claim_job(name, lambda labels: labels[0])
                if claimed is None:
                    break
                run(claimed)
        with self._conn() as conn:
            left = _labels(conn, "j.status IN ('PENDING', 'PROCESSING')")
            assert not left, f"after the drain, open jobs {sorted(left)}; refused: {refused}"
            assert not refused, refused
            self._note("drain")
            self.dirty, self.since_drain = False, 0
            serving_model(conn)  # ends a switch that may end
            stuck = conn.execute(
                """SELECT m.name FROM embedding_models m WHERE m.activating
                   AND NOT EXISTS (SELECT 1 FROM embedding_jobs j
                                   WHERE j.embedding_model_id = m.id AND j.status = 'FAILED')"""
            ).fetchone()
            assert stuck is None, f"the switch to {stuck['name']} owes nothing but did not end"

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        type(self).checks_run += 1
        self.since_drain += 1
        with self._conn() as conn:
            served = _served(conn)
            self._check_forward(conn, served)
            # what search served just before a switch that may end now (at this read of the
            # serving model; or in the step, by an activation or a delete): the rows of the
            # model serving at the last check
            before = {
                r["document_id"]: r["version_no"]
                for r in served
                if r["model_id"] == self.last_serving
            }
            model = serving_model(conn)
            assert model is not None
            if model.id != self.last_serving:
                self._note("switch")
                served = _served(conn)  # as the switch left them
            self._check_served_sets(served)
            self._check_search(conn, model, served, before)
            self._check_jobs(conn)
            self._check_blobs(conn)
            self._check_claims(conn)

    def _check_served_sets(self, served: Sequence[dict[str, Any]]) -> None:
        """(1) Every served version is its document's, was completed by its model, and has
        exactly one vector of that model per chunk of its set."""
        for row in served:
            what = f"{row['external_key']}@{row['version_no']}/{row['model']}"
            assert row["version_document"] == row["document_id"], f"{what}: another document's"
            assert row["job_status"] == "SUCCEEDED", f"{what} served, its job {row['job_status']}"
            counts = (row["chunk_count"], row["vectors"], row["matched"])
            assert counts == (row["chunks"],) * 3 and row["chunks"] > 0, (
                f"{what} served with chunk_count, vectors, matched {counts}"
                f" for {row['chunks']} chunks"
            )

    def _check_forward(self, conn: Connection, served: Sequence[dict[str, Any]]) -> None:
        """(2) No served version moves backwards or vanishes while its document and model
        exist; (8) each model serves the newest version it completed."""
        now = {(r["document_id"], r["model_id"]): r["version_no"] for r in served}
        documents = self._names(conn, "documents", "external_key")
        models = self._names(conn, "embedding_models", "name")

        def label(document: UUID, model: UUID) -> str:
            return f"{documents.get(document, document)}/{models.get(model, model)}"

        for (document, model), before in self.last_served.items():
            if document in documents and model in models:
                after = now.get((document, model))
                assert after is not None and after >= before, (
                    f"(2) {label(document, model)} served at version {before}, now {after}"
                )
        self.last_served = now
        if self.check_progress:
            newest = {
                (r["document_id"], r["model_id"]): r["version_no"]
                for r in conn.execute(_NEWEST_DONE_SQL).fetchall()
            }
            assert now == newest, (
                "(8) served versions differ from the newest each model completed: served "
                f"{sorted((label(*k), v) for k, v in now.items())}, completed"
                f" {sorted((label(*k), v) for k, v in newest.items())}"
            )

    @staticmethod
    def _names(conn: Connection, table: str, column: str) -> dict[UUID, str]:
        return {row["id"]: row[column] for row in conn.execute(f"SELECT id, {column} FROM {table}")}

    def _check_search(
        self,
        conn: Connection,
        model: EmbeddingModel,
        served: Sequence[dict[str, Any]],
        before_switch: dict[UUID, int],
    ) -> None:
        """(1) Every search mode returns exactly the chunks of the versions the serving model
        serves; (3) no document is served at an older version than before (nor dropped):
        than at the last check, and, across a switch, than the model serving before it served
        just before it."""
        rows = [r for r in served if r["model_id"] == model.id]
        search_map = {r["document_id"]: r["version_no"] for r in rows}
        documents = self._names(conn, "documents", "external_key")
        models = self._names(conn, "embedding_models", "name")
        for document in self.last_search.keys() | before_switch.keys():
            before = max(self.last_search.get(document, 0), before_switch.get(document, 0))
            if document in documents:
                after = search_map.get(document)
                assert after is not None and after >= before, (
                    f"(3) search served {documents[document]} at version {before} (model"
                    f" {models.get(self.last_serving) if self.last_serving else None}), now at"
                    f" {after} (model {model.name})"
                )
        self.last_serving, self.last_search = model.id, search_map
        chunks = conn.execute(
            """SELECT c.id, s.document_id, v.version_no,
                      c.search_vector @@ to_tsquery('english', %s) AS matches
               FROM served_versions s
                   JOIN document_versions v ON v.id = s.document_version_id
                   JOIN embedding_jobs j ON j.document_version_id = v.id
                                        AND j.embedding_model_id = s.embedding_model_id
                   JOIN document_chunks c ON c.document_version_id = v.id
                                         AND c.chunking = j.chunking
                   WHERE s.embedding_model_id = %s""",
            (" | ".join(QUERY.split()), model.id),
        ).fetchall()
        expected = {r["id"]: (r["document_id"], r["version_no"]) for r in chunks}
        matching = {r["id"] for r in chunks if r["matches"]}
        vector = fake_vector(QUERY, DIMENSION)
        # the vector mode ranks every served chunk, the text mode those with a query word
        modes: dict[str, tuple[list[RankedChunk], set[UUID]]] = {
            "vector": (vector_ranking(conn, model, vector, SEARCH_LIMIT), set(expected)),
            "text": (text_ranking(conn, model, QUERY, SEARCH_LIMIT), matching),
        }
        # hybrid_ranking is these two fused (trioindex.Index runs them apart and fuses too)
        modes["hybrid"] = (fuse([modes["vector"][0], modes["text"][0]]), set(expected))
        for mode, (ranked, wanted) in modes.items():
            for hit in ranked:
                assert hit.document_id in documents, f"{mode}: a deleted document {hit}"
                assert expected.get(hit.chunk_id) == (hit.document_id, hit.version_no), (
                    f"{mode}: {hit.document_key}@{hit.version_no} chunk {hit.chunk_index} is not"
                    f" in the version {model.name} serves ({search_map.get(hit.document_id)})"
                )
            got = [hit.chunk_id for hit in ranked]
            assert len(got) == len(set(got)) and set(got) == wanted, (
                f"{mode}: {len(got)} chunks returned, {len(wanted)} served"
            )

    def _check_jobs(self, conn: Connection) -> None:
        """(4) A SUCCEEDED job's chunk set has exactly one vector of its model per chunk, as
        many as its chunk_count; (5) attempts are numbered 1..n, at most one STARTED, and one
        exactly while the job is PROCESSING."""
        for row in conn.execute(_SUCCEEDED_SQL).fetchall():
            counts = (row["chunk_count"], row["vectors"], row["matched"])
            assert counts == (row["chunks"],) * 3 and row["chunks"] > 0, (
                f"{row['label']} SUCCEEDED: chunk_count, vectors, matched {counts}"
                f" for {row['chunks']} chunks"
            )
        for row in conn.execute(_ATTEMPTS_SQL).fetchall():
            what = f"{row['label']} ({row['status']})"
            assert row["numbers"] == list(range(1, row["attempt_count"] + 1)), (
                f"{what}: attempts {row['numbers']}, attempt_count {row['attempt_count']}"
            )
            assert row["started"] <= 1, f"{what}: {row['started']} attempts STARTED"
            processing = row["status"] == "PROCESSING"
            assert (row["started"] == 1) == processing, f"{what}: {row['started']} STARTED"
            if processing:
                assert row["started_no"] == row["attempt_count"], what
            if row["status"] == "SUCCEEDED":
                assert row["last_status"] == "SUCCEEDED", f"{what}: last attempt not SUCCEEDED"

    def _check_blobs(self, conn: Connection) -> None:
        """(7) Every version's blob is in the store, with its bytes."""
        for row in conn.execute(
            "SELECT DISTINCT storage_key, sha256, byte_size FROM document_versions"
        ).fetchall():
            info = self.store.stat(row["storage_key"])
            assert (info.size, info.sha256) == (row["byte_size"], row["sha256"]), row

    def _check_claims(self, conn: Connection) -> None:
        """The machine's idea of which claims own their jobs is the fence's."""
        owned = _owned(conn, [held.claim for held in self.helds])
        for held, owns in zip(self.helds, owned, strict=True):
            assert owns == held.live, f"{held!r}: the machine says live={held.live}, fence {owns}"


# -- the test -----------------------------------------------------------------------------------


def _settings() -> settings:
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=not _FUZZ,
        database=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


def test_random_interleavings_keep_every_invariant(
    pg_server_url: str, template_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Interleavings.server_url = pg_server_url
    Interleavings.template = template_database
    Interleavings.examples_run = Interleavings.steps_run = Interleavings.checks_run = 0
    Interleavings.tally.clear()
    started = time.monotonic()
    try:
        run_state_machine_as_test(hypothesis_seed(SEED)(Interleavings), settings=_settings())
    finally:
        if _FUZZ:
            with capsys.disabled():
                print(
                    f"\ninterleavings: seed {SEED}, {Interleavings.examples_run} examples,"
                    f" {Interleavings.steps_run} steps, {Interleavings.checks_run} checked states,"
                    f" {time.monotonic() - started:.1f} s"
                )
                for what, n in sorted(Interleavings.tally.items()):
                    print(f"  {what}: {n}")
