"""The checks on a running stack (issue 17). Each returns a dict with ``ok`` and what it saw.

1. migrate ran once, and finished before any worker started;
2. every worker replica registered under its container's hostname;
3. a folder ingested through the image's CLI ends with every job SUCCEEDED;
4. each worker's own health check passes;
5. stopping a worker (SIGTERM) while its jobs hang hands them back (job PENDING at once,
   attempt CANCELLED) and marks it STOPPED within the grace period, before any SIGKILL;
6. the workers' logs hold no password and no claim token.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.compose import Project, seconds, timestamp
from deploy.engine import log, state_dir

ROOT = Path(__file__).resolve().parents[1]
WAIT = 240.0

# Recorded from the moment workers start: every claim token the database hands out.
TOKEN_TRIGGER = """
CREATE TABLE deploy_check_claim_tokens (token uuid PRIMARY KEY);
CREATE FUNCTION deploy_check_record_token() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_token IS NOT NULL THEN
        INSERT INTO deploy_check_claim_tokens VALUES (NEW.claim_token) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER deploy_check_record_token AFTER INSERT OR UPDATE OF claim_token
    ON embedding_jobs FOR EACH ROW EXECUTE FUNCTION deploy_check_record_token();
"""


def sql(project: Project, query: str) -> list[list[str]]:
    """Rows of ``query`` run by psql inside the db container (local socket)."""
    env = project.services["db"].get("environment") or {}
    done = project.engine.command(
        "exec", project.container_names("db")[0],
        "psql", "-h", "/tmp", "-U", str(env.get("POSTGRES_USER", "postgres")),
        "-d", str(env.get("POSTGRES_DB", "postgres")),
        "-v", "ON_ERROR_STOP=1", "-AtF", "\t", "-c", query,
        timeout=60,
    )  # fmt: skip
    return [line.split("\t") for line in done.stdout.splitlines() if line]


def before_start(project: Project, service: str) -> None:
    if service == "worker":
        sql(project, TOKEN_TRIGGER)


def _until(what: str, predicate: Callable[[], bool], timeout: float = WAIT) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def _jobs(project: Project) -> dict[str, int]:
    rows = sql(project, "SELECT status, count(*) FROM embedding_jobs GROUP BY 1")
    return {status: int(n) for status, n in rows}


def _workers(project: Project) -> list[str]:
    return project.container_names("worker")


def _hostname(project: Project, name: str) -> str:
    return str(project.inspect(name)["Config"]["Hostname"])


def _folder(prefix: str) -> Path:
    """A folder the image's user (uid 10001) can read."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=state_dir()))
    path.chmod(0o755)
    return path


def check_migrate(project: Project) -> dict[str, Any]:
    migrates = project.container_names("migrate")
    state = project.inspect(migrates[0])["State"]
    finished = timestamp(state, "FinishedAt")
    starts = {n: timestamp(project.inspect(n)["State"], "StartedAt") for n in _workers(project)}
    first = min(starts.values())
    return {
        "ok": len(migrates) == 1 and state["ExitCode"] == 0 and finished <= first,
        "migrate containers": len(migrates),
        "exit code": state["ExitCode"],
        "finished before the first worker started by (s)": round(
            (first - finished).total_seconds(), 2
        ),
    }


def check_registration(project: Project) -> dict[str, Any]:
    hostnames = {n: _hostname(project, n) for n in _workers(project)}

    def registered() -> set[str]:
        rows = sql(project, "SELECT hostname FROM indexing_workers WHERE status = 'RUNNING'")
        return {r[0] for r in rows}

    waited = _until("workers RUNNING", lambda: set(hostnames.values()) <= registered(), 90)
    running = sorted(registered())
    return {
        "ok": sorted(hostnames.values()) == running,
        "container hostnames": hostnames,
        "RUNNING worker rows": running,
        "waited (s)": round(waited, 1),
    }


def check_ingest(project: Project) -> dict[str, Any]:
    folder = _folder("ingest-")
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for index, source in enumerate(sources):
        target = folder / f"{index:02d}-{source.name}"
        shutil.copyfile(source, target)
        target.chmod(0o644)
    started = time.monotonic()
    project.run_cli(folder, "ingest", "/in", "--wait")
    took = time.monotonic() - started
    jobs = _jobs(project)
    per_worker = sql(
        project,
        "SELECT w.hostname, count(*) FROM trioindex_job_attempts a "
        "JOIN indexing_workers w ON w.id = a.worker_id WHERE a.status = 'SUCCEEDED' GROUP BY 1",
    )
    shutil.rmtree(folder)
    return {
        "ok": jobs == {"SUCCEEDED": len(sources)},
        "files": len(sources),
        "jobs": jobs,
        "succeeded attempts per worker": {h: int(n) for h, n in per_worker},
        "ingest --wait took (s)": round(took, 1),
    }


def check_health(project: Project) -> dict[str, Any]:
    """Each worker's own health check, run as the engine would: a container is unhealthy only
    after ``retries`` failures in a row, so each gets up to that many runs."""
    retries = int((project.services["worker"].get("healthcheck") or {}).get("retries", 3))
    runs: dict[str, list[str]] = {}
    for name in _workers(project):
        runs[name] = []
        for _ in range(retries):
            started = time.monotonic()
            passed = project.healthcheck(name)
            runs[name].append(f"{'pass' if passed else 'FAIL'} {time.monotonic() - started:.1f} s")
            if passed:
                break
    return {
        "ok": all(r[-1].startswith("pass") for r in runs.values()),
        "runs (result, duration)": runs,
        "retries allowed": retries,
    }


def _embedder_mode(project: Project, kind: str, latency: float = 0.0) -> None:
    body = json.dumps({"kind": kind, "latency": latency})
    project.engine.command(
        "exec", project.container_names("tei")[0],
        "curl", "-fsS", "-X", "POST", "-H", "Content-Type: application/json",
        "-d", body, "http://127.0.0.1:80/_fake/mode",
        timeout=30,
    )  # fmt: skip


def _documents(prefix: str, count: int, what: str) -> Path:
    """A readable folder of ``count`` small distinct text files."""
    folder = _folder(prefix)
    for index in range(count):
        path = folder / f"{prefix}{index:02d}.txt"
        path.write_text(f"Document {index} for the {what} check. " * 40, encoding="utf-8")
        path.chmod(0o644)
    return folder


def check_sigterm(project: Project) -> dict[str, Any]:
    """Hang the embedder, fill every slot, stop worker 1 (SIGTERM, as compose stop does)."""
    worker_env = project.services["worker"]["environment"]
    grace = seconds(worker_env["TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD"], 30)
    stop_after = seconds(project.services["worker"].get("stop_grace_period"), 10)
    victim = _workers(project)[0]
    host = _hostname(project, victim)
    slots = int(worker_env.get("TRIOINDEX_WORKER_MAX_CONCURRENCY", "2"))
    folder = _documents("hang-", slots * len(_workers(project)) * 2, "shutdown")
    _embedder_mode(project, "hang")
    try:
        project.run_cli(folder, "ingest", "/in")
        held_query = (
            "SELECT j.id, a.id FROM embedding_jobs j JOIN indexing_workers w ON w.id = j.worker_id "
            "JOIN trioindex_job_attempts a ON a.embedding_job_id = j.id AND a.status = 'STARTED' "
            f"WHERE j.status = 'PROCESSING' AND w.hostname = '{host}' AND w.status = 'RUNNING'"
        )
        _until(f"{victim} holding {slots} jobs", lambda: len(sql(project, held_query)) >= slots, 90)
        held = sql(project, held_query)
        stopped_at = time.monotonic()
        project.engine.command("stop", victim, timeout=stop_after + 60)
        took = time.monotonic() - stopped_at
        job_ids = ", ".join(f"'{job}'" for job, _ in held)
        attempt_ids = ", ".join(f"'{attempt}'" for _, attempt in held)
        jobs_after = sql(
            project,
            f"SELECT j.status, coalesce(w.hostname, '') FROM embedding_jobs j "
            f"LEFT JOIN indexing_workers w ON w.id = j.worker_id WHERE j.id IN ({job_ids})",
        )
        attempts_after = [r[0] for r in sql(
            project, f"SELECT status FROM trioindex_job_attempts WHERE id IN ({attempt_ids})"
        )]  # fmt: skip
        row = sql(
            project,
            "SELECT status, extract(epoch FROM stopped_at - started_at) FROM indexing_workers "
            f"WHERE hostname = '{host}' ORDER BY started_at DESC LIMIT 1",
        )[0]
        exit_code = project.inspect(victim)["State"]["ExitCode"]
    finally:
        _embedder_mode(project, "normal")
    # Handed back: PENDING (or already claimed again by another worker), never still ours.
    handed_back = all(s == "PENDING" or (s == "PROCESSING" and h != host) for s, h in jobs_after)
    total = len(sources_done := sql(project, "SELECT 1 FROM embedding_jobs"))
    waited = _until(
        "every job SUCCEEDED after the stop",
        lambda: _jobs(project) == {"SUCCEEDED": total},
    )
    shutil.rmtree(folder)
    return {
        "ok": handed_back
        and set(attempts_after) == {"CANCELLED"}
        and row[0] == "STOPPED"
        and took < min(grace + 10, stop_after)
        and exit_code == 0,
        "stopped container": victim,
        "jobs it held": len(held),
        "those jobs right after the stop": [s for s, _ in jobs_after],
        "their attempts": attempts_after,
        "worker row": row[0],
        "stop took (s)": round(took, 1),
        "grace period (s)": grace,
        "stop_grace_period (s)": stop_after,
        "container exit code": exit_code,
        "all jobs SUCCEEDED afterwards, waited (s)": round(waited, 1),
        "jobs in total": len(sources_done),
    }


def check_logs(project: Project, secrets: list[str]) -> dict[str, Any]:
    tokens = [r[0] for r in sql(project, "SELECT token FROM deploy_check_claim_tokens")]
    found: dict[str, list[str]] = {}
    lines = 0
    for name, text in project.every_log().items():
        lines += len(text.splitlines())
        leaked = [f"secret {i}" for i, s in enumerate(secrets) if s in text]
        leaked += [f"claim token {t[:8]}…" for t in tokens if t in text]
        if leaked:
            found[name] = leaked
    return {
        "ok": not found and bool(tokens) and lines > 0,
        "log lines scanned": lines,
        "claim tokens looked for": len(tokens),
        "passwords looked for": len(secrets),
        "found": found,
    }


def run_steps(steps: list[tuple[str, Callable[[], dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Each step in turn; one failing check does not hide the others."""
    results: dict[str, dict[str, Any]] = {}
    for title, step in steps:
        started = time.monotonic()
        try:
            results[title] = step()
        except Exception as error:
            results[title] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            log("".join(traceback.format_exception(error))[-3000:])
        results[title]["check took (s)"] = round(time.monotonic() - started, 1)
        log(f"{'PASS' if results[title]['ok'] else 'FAIL'} {title}")
    return results


def run_all(project: Project, *, secrets: list[str]) -> dict[str, dict[str, Any]]:
    return run_steps(
        [
            ("migrate once, before the workers", lambda: check_migrate(project)),
            ("workers registered by hostname", lambda: check_registration(project)),
            ("ingest through the image's CLI", lambda: check_ingest(project)),
            ("worker health checks", lambda: check_health(project)),
            ("SIGTERM hands jobs back", lambda: check_sigterm(project)),
            ("logs hold no secrets or tokens", lambda: check_logs(project, secrets)),
        ]
    )
