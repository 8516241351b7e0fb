"""The chaos run: real worker processes under ``kill -9``, a faulty embedding server, a storage
outage and a PostgreSQL restart — then every invariant is checked.

One run, entirely on this machine:

* an embedded PostgreSQL 18 + pgvector in a fresh folder, with a trigger that records every claim
  token the database hands out, so the logs can be searched for them;
* moto's S3 server as a subprocess behind a TCP proxy that resets every connection during the
  storage outage (moto keeps its objects in memory: it is never restarted);
* the fake TEI server of testkit/embed_server.py, in this process, injecting 5xx, 429, dropped
  connections, slow and hung answers and a small share of NaN and wrong-dimension vectors,
  remembering which texts got an invalid vector;
* three ``trioindex worker`` processes; every few seconds a random one is killed with SIGKILL and
  a replacement is started;
* documents of every format, plus empty files, random bytes named ``.pdf`` and truncated
  ``.docx`` files, ingested in waves with ``trioindex ingest DIR --json`` while all this goes on.

After the fault phase the faults stop, the workers drain the queue (a bounded wait), get SIGTERM,
and the checks run against the database and every log the product wrote.

Modules: ``plan`` (what a run does) · ``corpus`` · ``faults`` (embedding faults, storage proxy,
outages) · ``fleet`` (workers, ingest waves) · ``run`` (one run) · ``evidence``, ``checks`` and
``logscan`` (the invariants). tests/test_chaos_smoke.py runs the checks on hand-made evidence and
one short run; bench/chaos.py (``just chaos``) runs full ones and writes the report. Like the
benchmarks, a run blocks and sleeps in its own threads.
"""

from testkit.chaos.checks import (
    CHECKS,
    check_attempts,
    check_embeddings_per_job,
    check_outcomes,
    check_served_forward,
    faulted_documents,
    run_checks,
)
from testkit.chaos.corpus import CorpusFile, make_corpus
from testkit.chaos.evidence import Check, Observed, Stored
from testkit.chaos.faults import VectorFault
from testkit.chaos.fleet import Fleet, Ingestor
from testkit.chaos.logscan import check_logs
from testkit.chaos.plan import FAULT_RATES, Options
from testkit.chaos.run import RunResult, new_run_folder, run_once

__all__ = [
    "CHECKS",
    "FAULT_RATES",
    "Check",
    "CorpusFile",
    "Fleet",
    "Ingestor",
    "Observed",
    "Options",
    "RunResult",
    "Stored",
    "VectorFault",
    "check_attempts",
    "check_embeddings_per_job",
    "check_logs",
    "check_outcomes",
    "check_served_forward",
    "faulted_documents",
    "make_corpus",
    "new_run_folder",
    "run_checks",
    "run_once",
]
