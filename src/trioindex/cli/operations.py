"""Commands that run and watch the system: ``worker``, ``migrate``, ``status``, ``db stop``,
``healthcheck``, ``jobs list|show|retry`` and ``models list|activate|remove``."""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import Annotated, Any
from uuid import UUID

import typer

from trioindex import values
from trioindex.cli.common import (
    JsonFlag,
    ModelName,
    app,
    command_settings,
    database_call,
    friendly,
    logger,
    print_json,
    priority_option,
    run,
)
from trioindex.config import Settings
from trioindex.db.embedded_users import ServerState, server_state
from trioindex.errors import ConfigError
from trioindex.values import JobStatus

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
    settings = command_settings(json_logs, storage=True, buffered_logs=True)
    from trioindex.worker.wiring import run_worker

    if metrics_port is not None:
        from trioindex.worker.metrics import start_metrics_server

        start_metrics_server(metrics_port)
    done = run(functools.partial(run_worker, settings, drain=drain, own_process=True))
    logger.info("worker exited: %s", done.counters.snapshot())


@app.command()
@friendly
def migrate() -> None:
    """Apply pending schema migrations (safe to run from several processes at once)."""
    settings = command_settings()
    from trioindex.db.pool import migrate_or_explain
    from trioindex.services import resolve_database_url

    url = run(functools.partial(resolve_database_url, settings))
    applied = migrate_or_explain(url)
    typer.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


# --- status / db / healthcheck --------------------------------------------------------------


@app.command()
@friendly
def status(as_json: JsonFlag = False) -> None:
    """Jobs by status, oldest pending age, retries, failures by type, and workers."""
    settings = command_settings(quiet=True)
    from trioindex.db.operations.queue_status import queue_status

    embedded = _embedded_state(settings)
    result = database_call(
        settings, queue_status, heartbeat_timeout=settings.worker.heartbeat_timeout
    )
    if as_json:
        payload = values.as_json(result)
        assert isinstance(payload, dict)
        payload["workers"] = [{**values.as_json(w), "state": w.state} for w in result.workers]  # type: ignore[dict-item]
        print_json(payload)
        return
    typer.echo("jobs:    " + "  ".join(f"{k} {v}" for k, v in result.jobs_by_status.items()))
    age = result.oldest_pending_age_seconds
    typer.echo(f"pending: oldest {age:.1f}s ago" if age is not None else "pending: none")
    typer.echo(f"retries scheduled: {result.retries_scheduled}")
    if result.serving_model is not None:
        typer.echo(f"model:   {result.serving_model} serves search")
    if (switch := result.switch) is not None:
        typer.echo(
            f"switch:  to {switch.name}: {switch.covered}/{switch.documents} documents covered,"
            f" {switch.pending_jobs} job(s) open, {switch.failed_jobs} failed"
            " (`trioindex models list`)"
        )
    if result.failures_by_type:
        typer.echo("failures: " + "  ".join(f"{k} {v}" for k, v in result.failures_by_type.items()))
    # workers that stopped cleanly are counted, not listed (the last hour's; older ones not)
    shown = [w for w in result.workers if w.state != "STOPPED"]
    stopped = len(result.workers) - len(shown)
    typer.echo(f"workers: {len(shown)}" + (f" (and {stopped} stopped)" if stopped else ""))
    for w in shown:
        typer.echo(
            f"  {w.id}  {w.state:8} {w.hostname}:{w.pid}"
            f"  running {w.running_jobs}/{w.max_concurrency}"
            f"  heartbeat {w.heartbeat_age_seconds:.0f}s ago"
        )
    if embedded is not None:
        typer.echo(_embedded_line(settings, embedded))


def _embedded_state(settings: Settings) -> ServerState | None:
    """None with database.url set; else the embedded server's state before this command."""
    if settings.database.url:
        return None
    return server_state(settings.home.resolve() / "pgdata")


def _embedded_line(settings: Settings, state: ServerState) -> str:
    where = f"database: embedded PostgreSQL under {settings.home.resolve() / 'pgdata'}"
    if state.running and state.users:
        return (
            f"{where}, running (it stops when the last trioindex process using it exits;"
            " `trioindex db stop` stops it now)"
        )
    if state.running:
        died = ", ".join(str(pid) for pid in state.gone) or "unknown"
        return (
            f"{where}, left running by a process that died (pid {died});"
            " it stops when this command exits"
        )
    return f"{where}, started for this command only"


def _embedded_running(settings: Settings) -> bool | None:
    """None with database.url set; else whether the embedded server under home is running."""
    state = _embedded_state(settings)
    return None if state is None else state.running


db_app = typer.Typer(no_args_is_help=True, help="The embedded PostgreSQL (no database.url).")
app.add_typer(db_app, name="db")


@db_app.command("stop")
@friendly
def db_stop() -> None:
    """Stop the embedded PostgreSQL under home now, whoever started it."""
    settings = command_settings(quiet=True, database=False)
    pgdata = settings.home.resolve() / "pgdata"
    running = _embedded_running(settings)
    if running is None:
        typer.echo("nothing to stop: database.url names an external PostgreSQL")
        return
    if not running:
        typer.echo(f"no embedded PostgreSQL is running under {pgdata}")
        return
    from trioindex.db.pool import stop_embedded

    stop_embedded(settings.home)
    typer.echo(f"stopped the embedded PostgreSQL under {pgdata}")


@app.command()
@friendly
def healthcheck() -> None:
    """Exit 0 when the database answers and this host's worker heartbeat is fresh."""
    settings = command_settings(quiet=True)
    from trioindex.db.operations.workers import fresh_worker_on_host

    fresh = database_call(
        settings,
        fresh_worker_on_host,
        socket.gethostname(),
        settings.worker.heartbeat_timeout,
    )
    if not fresh:
        typer.echo(f"no fresh worker heartbeat from {socket.gethostname()}", err=True)
        raise typer.Exit(1)
    typer.echo("ok")


# --- jobs ----------------------------------------------------------------------------------------

jobs_app = typer.Typer(no_args_is_help=True, help="List, inspect and retry indexing jobs.")
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("list")
@friendly
def jobs_list(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    settings = command_settings(quiet=True)
    from trioindex.db.operations.job_listings import job_page

    page = database_call(settings, job_page, status=status, limit=limit)
    if as_json:
        print_json(list(page.jobs))
        return
    if not page.jobs:
        typer.echo("no jobs" + (f" with status {status.value}" if status else ""))
        return
    documents = [f"{job.document_key} (v{job.version_no})" for job in page.jobs]
    width = max(len("DOCUMENT (VERSION)"), *(len(d) for d in documents))
    typer.echo(
        f"{'JOB':36}  {'STATUS':10} {'DONE':>4}  ATTEMPTS  {'DOCUMENT (VERSION)':{width}}  FAILURE"
    )
    for job, document in zip(page.jobs, documents, strict=True):
        failure = ""
        if job.last_failure_type:
            message = " ".join((job.last_failure_message or "").split())
            failure = f"{job.last_failure_type}" + (f": {message[:120]}" if message else "")
        typer.echo(
            f"{job.id}  {job.status:10} {_done(job):>4}  {job.attempts_spent:>3}/"
            f"{job.attempt_budget:<4}  {document:{width}}  {failure}".rstrip()
        )
    if page.total > len(page.jobs):
        typer.echo(f"{len(page.jobs)} of {page.total} jobs (--limit shows more)")


def _done(job: Any) -> str:
    """The DONE column: the progress of a job that runs or ran to the end; a FAILED job's
    progress says nothing about the document, so none is shown."""
    return "-" if job.status == JobStatus.FAILED else f"{job.progress}%"


def _job_ref(given: str | None) -> str | None:
    """A job id or the start of one, as ids are printed (hex digits and hyphens); a usage
    error naming the argument otherwise."""
    if given is None:
        return None
    text = given.strip().lower()
    if not text or not set(text) <= set("0123456789abcdef-"):
        raise typer.BadParameter(f"not a job id or the start of one: {given!r}")
    return text


def _job_id(conn: Any, ref: str) -> UUID:
    """The job a full id or a unique start of one names (logs print short ids)."""
    from trioindex.db.operations.job_listings import job_ids_with_prefix
    from trioindex.errors import NotFound

    if len(ref.replace("-", "")) == 32:
        with contextlib.suppress(ValueError):  # hyphens in odd places: a prefix, then
            return UUID(ref)
    found = job_ids_with_prefix(conn, ref, limit=2)
    if not found:
        raise NotFound(f"no job with an id that starts with {ref}")
    if len(found) > 1:
        raise NotFound(f"more than one job id starts with {ref}; give more of it")
    return found[0]


@jobs_app.command("show")
@friendly
def jobs_show(
    job_id: Annotated[
        str, typer.Argument(callback=_job_ref, help="The job's id, or a unique start of it.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """One job with its attempts, failure types and timings."""
    settings = command_settings(quiet=True)
    from trioindex.db.operations.job_listings import show_job

    job = database_call(settings, lambda conn: show_job(conn, _job_id(conn, job_id)))
    if as_json:
        print_json(job)
        return
    typer.echo(f"job {job.id}: {job.status} ({_done(job)})")
    served = "served by its model" if job.version_served else "not served by its model"
    typer.echo(f"document {job.document_key} version {job.version_no} ({served})")
    typer.echo(
        f"model {job.model}, priority {job.priority},"
        f" attempts {job.attempts_spent}/{job.attempt_budget}"
        + (f" ({job.attempt_count} in all)" if job.attempt_count != job.attempts_spent else "")
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
        for line in a.step_lines():
            typer.echo(f"    {line}")


@jobs_app.command("retry")
@friendly
def jobs_retry(
    job_id: Annotated[
        str | None,
        typer.Argument(callback=_job_ref, help="The job's id, or a unique start of it."),
    ] = None,
    all_failed: Annotated[
        bool, typer.Option("--all-failed", help="Retry every FAILED job.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Send FAILED jobs back to the queue with a fresh attempt budget."""
    if (job_id is None) == (not all_failed):
        typer.echo("trioindex: give a job id or --all-failed (not both)", err=True)
        raise typer.Exit(2)
    settings = command_settings(quiet=True)
    from trioindex.db.operations.job_listings import failed_job_ids, retry_failed_job

    def retry(conn: Any) -> list[Any]:
        ids = failed_job_ids(conn) if job_id is None else [_job_id(conn, job_id)]
        return [retry_failed_job(conn, i, extra_attempts=settings.worker.max_attempts) for i in ids]

    retried = database_call(settings, retry)
    if as_json:
        print_json(retried)
        return
    for job in retried:
        typer.echo(f"{job.id}  PENDING  {job.document_key} v{job.version_no}")
    typer.echo(f"{len(retried)} job(s) back in the queue")


# --- models (the index over time) ------------------------------------------------------------


models_app = typer.Typer(no_args_is_help=True, help="List, activate and remove embedding models.")
app.add_typer(models_app, name="models")


@models_app.command("list")
@friendly
def models_list(as_json: JsonFlag = False) -> None:
    """Every model: dimension, serving or switching, documents covered / total."""
    settings = command_settings(quiet=True)
    from trioindex.db.models import model_list

    views = database_call(settings, model_list)
    if as_json:
        print_json(views)
        return
    for v in views:
        state = "serving" if v.serving else "switching to" if v.activating else "inactive"
        extra = f"  {v.pending_jobs} job(s) open" if v.pending_jobs else ""
        extra += f"  {v.failed_jobs} failed" if v.failed_jobs else ""
        typer.echo(
            f"{v.name}  {v.dimension} dims  {state:12} covers {v.covered}/{v.documents}{extra}"
        )


@models_app.command("activate")
@friendly
def models_activate(
    name: ModelName,
    dimension: Annotated[
        int | None, typer.Option(min=1, max=16000, help="Needed for a new model.")
    ] = None,
    priority: Annotated[int, priority_option("Priority of the switch's jobs.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Switch search to model NAME: enqueue one job per document for it; search keeps the
    serving model until NAME covers every document, then switches in one transaction."""
    settings = command_settings(quiet=True)
    from trioindex.db.models import activate_model, find_model

    def activate(conn: Any) -> Any:
        known = find_model(conn, name)
        dim = dimension or (known.dimension if known else None)
        if dim is None:
            raise ConfigError(f"model {name!r} is new: give its --dimension")
        return activate_model(
            conn, name, dim, max_attempts=settings.worker.max_attempts, priority=priority
        )

    result = database_call(settings, activate)
    if as_json:
        print_json(result)
        return
    if result.switched:
        typer.echo(f"{name} serves search now")
    else:
        typer.echo(
            f"switching to {name}: {result.jobs} job(s) enqueued; run a worker with"
            f" embedding.model = {name}; `trioindex models list` shows the progress"
        )


@models_app.command("remove")
@friendly
def models_remove(name: ModelName, as_json: JsonFlag = False) -> None:
    """Drop a model that does not serve search: its vectors, jobs and HNSW index."""
    settings = command_settings(quiet=True)
    from trioindex.db.models import remove_model

    removed = database_call(settings, remove_model, name)
    if as_json:
        print_json(removed)
        return
    chunks = f", {removed.chunks} chunk(s) of its own" if removed.chunks else ""
    typer.echo(f"removed {name}: {removed.embeddings} vector(s), {removed.jobs} job(s){chunks}")
