"""The ``trioindex`` command line: worker, migrate, ingest, search, status, jobs, healthcheck.

Every command that prints data takes ``--json``. Errors meant for people (bad configuration, a
database that is down, an unknown job, a model mismatch) print one line and exit non-zero;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar
from uuid import UUID

import psycopg
import trio
import typer

from trioindex import admin
from trioindex.config import Settings, load_settings
from trioindex.db.pool import migrate_or_explain
from trioindex.errors import ConfigError, TrioindexError
from trioindex.logs import configure_logging
from trioindex.values import JobStatus

logger = logging.getLogger("trioindex.cli")

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Turn documents into searchable pgvector embeddings with a fleet of Trio workers.",
    # a bug's traceback must not print local variables: they hold URLs with passwords
    pretty_exceptions_show_locals=False,
)
jobs_app = typer.Typer(no_args_is_help=True, help="List, inspect and retry indexing jobs.")
app.add_typer(jobs_app, name="jobs")

P = ParamSpec("P")
T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def friendly(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn trioindex's own errors into one line on stderr and a non-zero exit.

    Errors raised inside Trio nurseries arrive wrapped in exception groups; a group holding one
    error is explained as that error (a database that went away while the worker registers is
    still one line, not a traceback).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            explained = _explain(_sole_error(exc))
            if explained is None:
                raise
            code, line = explained
            typer.echo(f"trioindex: {line}", err=True)
            raise typer.Exit(code) from None

    return wrapper


def _sole_error(exc: BaseException) -> BaseException:
    """The one error inside (nested) single-member exception groups, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _explain(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and message for an error meant for people; None for a bug."""
    from psycopg_pool import PoolTimeout

    if isinstance(exc, ConfigError):
        return 2, f"configuration error: {exc}"
    if isinstance(exc, TrioindexError | FileNotFoundError):
        return 1, str(exc)
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        # the server went away mid-command (restart, failover, network); every command is
        # safe to re-run: ingest skips what it already enqueued. A client-side failure's first
        # line names host and port, never the password; a server-sent one (it has a SQLSTATE)
        # may quote data, so only its class is named.
        sqlstate = getattr(exc, "sqlstate", None)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = f"{type(exc).__name__}, SQLSTATE {sqlstate}" if sqlstate else first
        return 1, f"lost the database connection ({why}); re-run"
    if isinstance(exc, psycopg.Error):
        # the class and SQLSTATE only: a server message may quote the data it refused
        return 1, f"database error {type(exc).__name__} (SQLSTATE {exc.sqlstate or '?'})"
    return None


def _settings(json_logs: bool = False, quiet: bool = False) -> Settings:
    settings = load_settings()
    configure_logging(
        "json" if json_logs else settings.log_format,
        logging.WARNING if quiet else logging.INFO,
    )
    return settings


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


def _print_json(value: object) -> None:
    typer.echo(json.dumps(admin.as_json(value), ensure_ascii=False, indent=2))


# --- worker / migrate ----------------------------------------------------------------------------


@app.command()
@friendly
def worker(
    drain: Annotated[
        bool, typer.Option(help="Exit 0 once nothing is claimable and nothing is running.")
    ] = False,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port.")
    ] = None,
    json_logs: Annotated[bool, typer.Option(help="Log one JSON object per line.")] = False,
) -> None:
    """Run a worker: migrate, register, then claim and index jobs until SIGTERM/SIGINT."""
    settings = _settings(json_logs)
    from trioindex.worker.wiring import run_worker

    if metrics_port is not None:
        from trioindex.worker.metrics import start_metrics_server

        start_metrics_server(metrics_port)
    done = _run(functools.partial(run_worker, settings, drain=drain))
    logger.info("worker exited: %s", done.counters.snapshot())


@app.command()
@friendly
def migrate() -> None:
    """Apply pending schema migrations (safe to run from several processes at once)."""
    settings = _settings()
    from trioindex.services import resolve_database_url

    url = _run(functools.partial(resolve_database_url, settings))
    applied = migrate_or_explain(url)
    typer.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


# --- ingest --------------------------------------------------------------------------------------


@app.command()
@friendly
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders (recursive).")],
    wait: Annotated[bool, typer.Option(help="Wait until every job ends; show progress.")] = False,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks",
            help="Also follow symbolic links whose target is outside the folder.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Upload files and enqueue one indexing job per new or changed document.

    A file that cannot be ingested is reported and the rest go on; the exit code is 1 when any
    was.
    """
    settings = _settings(quiet=as_json)
    from trioindex.ingest import IngestEntry, IngestResult, ingest_paths
    from trioindex.services import open_services

    async def go() -> tuple[list[IngestEntry], list[dict[str, Any]]]:
        async with open_services(settings) as services:
            entries = await ingest_paths(
                paths,
                db=services.db,
                store=services.storage,
                model_id=services.model.id,
                max_attempts=settings.worker.max_attempts,
                priority=priority,
                follow_symlinks=follow_symlinks,
            )
            finals: list[dict[str, Any]] = []
            if wait:
                from trioindex.progress import wait_for_jobs

                queued = [
                    e.job_id
                    for e in entries
                    if isinstance(e, IngestResult)
                    and e.job_id
                    and (e.status == "created" or e.requeued)
                ]
                finals = await wait_for_jobs(services.db, queued, show=not as_json)
            return entries, finals

    entries, finals = _run(go)
    failed = [f for f in finals if f["status"] == "FAILED"]
    for entry in entries:
        typer.echo(json.dumps(entry.as_json()) if as_json else _ingest_line(entry))
    if not as_json:
        typer.echo(_ingest_summary(entries))
    errors = sum(1 for e in entries if e.status == "error")
    if errors:
        typer.echo(f"trioindex: {errors} file(s) could not be ingested (see above)", err=True)
    for f in failed:
        typer.echo(f"FAILED {f['external_key']}: {f['last_failure_type']}", err=True)
    if failed or errors:
        raise typer.Exit(1)


def _ingest_line(entry: Any) -> str:
    """One human line per file: what happened, the key, and the version or the reason."""
    from trioindex.ingest import IngestResult

    if not isinstance(entry, IngestResult):
        return f"{entry.status:9} {entry.document_key or entry.path}  {entry.reason}"
    note = f"version {entry.version_no}"
    if entry.status == "repaired":
        note += ": stored copy restored" + (", job requeued" if entry.requeued else "")
    return f"{entry.status:9} {entry.document_key}  ({note})"


def _ingest_summary(entries: list[Any]) -> str:
    counts = {s: sum(1 for e in entries if e.status == s) for s in _INGEST_STATUSES}
    parts = [f"{counts['created']} enqueued", f"{counts['unchanged']} unchanged"]
    parts += [f"{counts[s]} {s}" for s in ("repaired", "skipped") if counts[s]]
    if counts["error"]:
        parts.append(f"{counts['error']} error" + ("s" if counts["error"] > 1 else ""))
    return ", ".join(parts)


_INGEST_STATUSES = ("created", "unchanged", "repaired", "skipped", "error")


# --- search / status -----------------------------------------------------------------------------


@app.command()
@friendly
def search(
    text: Annotated[str, typer.Argument(help="What to look for.")],
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=1000)] = 5,
    as_json: JsonFlag = False,
) -> None:
    """Embed the query with the index's model and print the closest chunks."""
    settings = _settings(quiet=True)
    from trioindex.search import SearchHit, embed_query, search_vectors
    from trioindex.services import open_services

    async def go() -> list[SearchHit]:
        async with open_services(settings, embedder=True) as services:
            assert services.embedder is not None
            vector = await embed_query(services.embedder, services.model, text)
            return await services.db.run(search_vectors, services.model, vector, top_k)

    hits = _run(go)
    if as_json:
        _print_json([{**admin.as_json(h), "text": h.text} for h in hits])  # type: ignore[dict-item]
        return
    if not hits:
        typer.echo("no results (is anything indexed yet? try `trioindex status`)")
    for hit in hits:
        typer.echo(f"{hit.rank:>3}. {hit.score:.4f}  {hit.document_key} #{hit.chunk_index}")
        typer.echo(f"     {hit.snippet()}")


def _database_call(settings: Settings, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    from trioindex.db.pool import open_database
    from trioindex.services import resolve_database_url

    async def go() -> T:
        url = await resolve_database_url(settings)
        async with open_database(url, pool_size=1) as db:
            return await db.run(fn, *args, **kwargs)

    return _run(go)


@app.command()
@friendly
def status(as_json: JsonFlag = False) -> None:
    """Jobs by status, oldest pending age, retries, failures by type, and workers."""
    settings = _settings(quiet=True)
    result = _database_call(
        settings, admin.queue_status, heartbeat_timeout=settings.worker.heartbeat_timeout
    )
    if as_json:
        payload = admin.as_json(result)
        assert isinstance(payload, dict)
        payload["workers"] = [{**admin.as_json(w), "state": w.state} for w in result.workers]  # type: ignore[dict-item]
        _print_json(payload)
        return
    typer.echo("jobs:    " + "  ".join(f"{k} {v}" for k, v in result.jobs_by_status.items()))
    age = result.oldest_pending_age_seconds
    typer.echo(f"pending: oldest {age:.1f}s ago" if age is not None else "pending: none")
    typer.echo(f"retries scheduled: {result.retries_scheduled}")
    if result.failures_by_type:
        typer.echo("failures: " + "  ".join(f"{k} {v}" for k, v in result.failures_by_type.items()))
    typer.echo(f"workers: {len(result.workers)}")
    for w in result.workers:
        typer.echo(
            f"  {w.id}  {w.state:8} {w.hostname}:{w.pid}"
            f"  running {w.running_jobs}/{w.max_concurrency}"
            f"  heartbeat {w.heartbeat_age_seconds:.0f}s ago"
        )


@app.command()
@friendly
def healthcheck() -> None:
    """Exit 0 when the database answers and this host's worker heartbeat is fresh."""
    settings = _settings(quiet=True)
    fresh = _database_call(
        settings,
        admin.fresh_worker_on_host,
        socket.gethostname(),
        settings.worker.heartbeat_timeout,
    )
    if not fresh:
        typer.echo(f"no fresh worker heartbeat from {socket.gethostname()}", err=True)
        raise typer.Exit(1)
    typer.echo("ok")


# --- jobs ----------------------------------------------------------------------------------------


@jobs_app.command("list")
@friendly
def jobs_list(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    settings = _settings(quiet=True)
    jobs = _database_call(settings, admin.list_jobs, status=status, limit=limit)
    if as_json:
        _print_json(jobs)
        return
    for job in jobs:
        failure = f"  {job.last_failure_type}" if job.last_failure_type else ""
        typer.echo(
            f"{job.id}  {job.status:10} {job.progress:>3}%  attempts {job.attempt_count}/"
            f"{job.max_attempts}  {job.document_key} v{job.version_no}{failure}"
        )


@jobs_app.command("show")
@friendly
def jobs_show(job_id: UUID, as_json: JsonFlag = False) -> None:
    """One job with its attempts, failure types and timings."""
    settings = _settings(quiet=True)
    job = _database_call(settings, admin.show_job, job_id)
    if as_json:
        _print_json(job)
        return
    typer.echo(f"job {job.id}: {job.status} ({job.progress}%)")
    typer.echo(f"document {job.document_key} version {job.version_no} ({job.version_status})")
    typer.echo(
        f"model {job.model}, priority {job.priority},"
        f" attempts {job.attempt_count}/{job.max_attempts}"
    )
    if job.last_failure_type:
        typer.echo(f"last failure: {job.last_failure_type}: {job.last_failure_message}")
    for a in job.attempts:
        took = (
            f"{(a.finished_at - a.started_at).total_seconds():.2f}s" if a.finished_at else "running"
        )
        failure = f"  {a.failure_type}: {a.failure_message}" if a.failure_type else ""
        typer.echo(
            f"  attempt {a.attempt_no}: {a.status:9} {took:>9}  worker {a.worker_id}{failure}"
        )


@jobs_app.command("retry")
@friendly
def jobs_retry(
    job_id: Annotated[UUID | None, typer.Argument()] = None,
    all_failed: Annotated[
        bool, typer.Option("--all-failed", help="Retry every FAILED job.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Send FAILED jobs back to the queue with a fresh attempt budget."""
    if (job_id is None) == (not all_failed):
        typer.echo("trioindex: give a job id or --all-failed (not both)", err=True)
        raise typer.Exit(2)
    settings = _settings(quiet=True)

    def retry(conn: Any) -> list[Any]:
        ids = admin.failed_job_ids(conn) if job_id is None else [job_id]
        return [
            admin.retry_failed_job(conn, i, extra_attempts=settings.worker.max_attempts)
            for i in ids
        ]

    retried = _database_call(settings, retry)
    if as_json:
        _print_json(retried)
        return
    for job in retried:
        typer.echo(f"{job.id}  PENDING  {job.document_key} v{job.version_no}")
    typer.echo(f"{len(retried)} job(s) back in the queue")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
