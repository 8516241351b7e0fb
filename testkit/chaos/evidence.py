"""The evidence the chaos checks judge: what the harness saw (:class:`Observed`), what the
database holds once the workers have stopped (:class:`Stored`), and a check's verdict."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs

from testkit.chaos.corpus import CorpusFile
from testkit.chaos.faults import VectorFault
from testkit.chaos.fleet import Fleet, Ingestor, WorkerProcess
from testkit.claim_tokens import seen_tokens
from testkit.embed_server import ServerStats
from testkit.processes import query


@attrs.frozen
class Check:
    name: str
    ok: bool
    detail: str


@attrs.define(eq=False)
class Observed:
    """What the harness itself saw during the run."""

    corpus: Sequence[CorpusFile]
    tag: str
    secret: str = attrs.field(repr=False)
    logs: Path
    fleet: Fleet
    exits: Sequence[WorkerProcess]
    unregistered: Sequence[WorkerProcess]  # live workers that never registered by the end
    ingestor: Ingestor
    drained: bool
    vector_faults: Sequence[VectorFault]
    server: ServerStats
    fault_rates: Mapping[str, float]
    outages: Sequence[tuple[str, float, float]]
    storage_resets: int


@attrs.define(eq=False)
class Stored:
    """What the database holds once the workers have stopped."""

    url: str
    # one row per job (one per version and model): its document, version and model, the
    # version its model serves for the document (served_versions), and the counts of its own
    # chunk set and of its model's vectors
    jobs: list[dict[str, Any]]
    attempts: dict[UUID, list[dict[str, Any]]]  # per job, in attempt order
    keys_of_text: dict[str, set[str]]  # chunk content -> keys of the documents that have it
    tokens: set[str]  # every claim token the database handed out
    events: Counter[str]
    retries_by_type: Counter[str]

    @property
    def by_key(self) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job in self.jobs:
            grouped[job["external_key"]].append(job)
        return grouped

    @property
    def status_counts(self) -> Counter[str]:
        return Counter(str(job["status"]) for job in self.jobs)

    @property
    def attempt_rows(self) -> list[dict[str, Any]]:
        return [row for rows in self.attempts.values() for row in rows]

    @classmethod
    def load(cls, url: str) -> Stored:
        jobs = query(
            url,
            """SELECT d.external_key, v.id AS version_id, v.version_no, j.id AS job_id,
                      j.embedding_model_id AS model_id, m.is_active AS serving, j.status,
                      j.chunk_count, j.attempt_count, j.max_attempts, j.last_failure_type,
                      j.lease_expires_at < clock_timestamp() AS lease_expired,
                      s.document_version_id AS served_version_id,
                      sv.version_no AS served_version_no,
                      (SELECT count(*) FROM document_chunks c
                        WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS chunks,
                      (SELECT count(DISTINCT c.chunk_index) FROM document_chunks c
                        WHERE c.document_version_id = v.id
                          AND c.chunking = j.chunking) AS distinct_indexes,
                      (SELECT coalesce(max(c.chunk_index), -1) FROM document_chunks c
                        WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS max_index,
                      (SELECT count(*) FROM embeddings e
                        JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
                        WHERE e.document_version_id = v.id
                          AND e.embedding_model_id = j.embedding_model_id) AS vectors,
                      (SELECT count(*) FROM embeddings e WHERE e.document_version_id = v.id
                          AND e.embedding_model_id = j.embedding_model_id) AS all_vectors
               FROM documents d
               JOIN document_versions v ON v.document_id = d.id
               JOIN embedding_jobs j ON j.document_version_id = v.id
               JOIN embedding_models m ON m.id = j.embedding_model_id
               LEFT JOIN served_versions s
                 ON s.document_id = d.id AND s.embedding_model_id = j.embedding_model_id
               LEFT JOIN document_versions sv ON sv.id = s.document_version_id""",
        )
        attempts: dict[UUID, list[dict[str, Any]]] = defaultdict(list)
        for row in query(
            url,
            """SELECT embedding_job_id, attempt_no, status, failure_type
               FROM trioindex_job_attempts ORDER BY embedding_job_id, attempt_no""",
        ):
            attempts[row["embedding_job_id"]].append(row)
        keys_of_text: dict[str, set[str]] = defaultdict(set)
        for row in query(
            url,
            """SELECT c.content, d.external_key FROM document_chunks c
               JOIN documents d ON d.id = c.document_id""",
        ):
            keys_of_text[row["content"]].add(row["external_key"])
        events: Counter[str] = Counter()
        retries_by_type: Counter[str] = Counter()
        for row in query(
            url,
            """SELECT event_type, detail->>'failure_type' AS failure_type, count(*) AS n
               FROM indexing_events GROUP BY 1, 2""",
        ):
            events[row["event_type"]] += row["n"]
            if row["event_type"] == "JOB_RETRY_SCHEDULED":
                retries_by_type[row["failure_type"]] += row["n"]
        tokens = seen_tokens(url)
        return cls(url, jobs, dict(attempts), dict(keys_of_text), tokens, events, retries_by_type)


def _summary(problems: list[str], limit: int = 8) -> str:
    shown = "; ".join(problems[:limit])
    return shown + (f"; ... {len(problems) - limit} more" if len(problems) > limit else "")


def check(name: str, problems: list[str], fine: str) -> Check:
    return Check(name, not problems, _summary(problems) if problems else fine)
