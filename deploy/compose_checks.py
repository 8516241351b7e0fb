"""The checks that go through Docker Compose's own commands, on a stack ``docker compose up``
started (deploy/compose_stack.py). Each returns a dict with ``ok`` and what it saw.

- ``docker compose stop worker`` while every worker's jobs hang: each worker hands its jobs
  back (job PENDING, attempt CANCELLED), its row is STOPPED and its container exits 0 within the
  grace period; ``docker compose start worker`` then finishes them;
- ``docker kill -s KILL`` on one worker's container while it holds jobs: the others recover
  them (attempt EXPIRED, job finished by another worker). Compose's own ``kill`` has no replica
  selector, hence the engine's. compose.yaml keeps the default 5-minute lease, so the check
  moves the dead worker's lease expiry to now instead of waiting it out;
- ``docker compose restart --no-deps db`` while jobs are queued: nothing lost, every job
  SUCCEEDED, the workers still RUNNING afterwards;
- ``docker compose up --scale worker=6``: six workers registered under their hostnames, and a
  new folder's jobs shared among more than the first three.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from deploy.checks import (
    _documents,
    _embedder_mode,
    _hostname,
    _jobs,
    _until,
    _workers,
    sql,
)
from deploy.compose import seconds
from deploy.compose_stack import ComposeProject

HELD = (
    "SELECT j.id, a.id, w.hostname FROM embedding_jobs j "
    "JOIN indexing_workers w ON w.id = j.worker_id "
    "JOIN trioindex_job_attempts a ON a.embedding_job_id = j.id AND a.status = 'STARTED' "
    "WHERE j.status = 'PROCESSING' AND w.status = 'RUNNING'"
)


def _slots(project: ComposeProject) -> int:
    env = project.services["worker"]["environment"]
    return int(env.get("TRIOINDEX_WORKER_MAX_CONCURRENCY", "2"))


def _quoted(ids: list[str]) -> str:
    return ", ".join(f"'{i}'" for i in ids)


def _statuses(project: ComposeProject, table: str, ids: list[str]) -> list[str]:
    return [r[0] for r in sql(project, f"SELECT status FROM {table} WHERE id IN ({_quoted(ids)})")]


def _all_succeeded(project: ComposeProject) -> bool:
    jobs = _jobs(project)
    return set(jobs) == {"SUCCEEDED"}


def check_compose_stop(project: ComposeProject) -> dict[str, Any]:
    workers = _workers(project)
    hosts = {_hostname(project, n) for n in workers}
    slots = _slots(project)
    env = project.services["worker"]["environment"]
    grace = seconds(env["TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD"], 30)
    stop_after = seconds(project.services["worker"].get("stop_grace_period"), 10)
    folder = _documents("stop-", slots * len(workers) * 2, "compose stop")
    _embedder_mode(project, "hang")
    try:
        project.run_cli(folder, "ingest", "/in")

        def every_worker_full() -> bool:
            held = sql(project, HELD)
            return all(sum(1 for r in held if r[2] == h) >= slots for h in hosts)

        _until("every worker holding its slots", every_worker_full, 90)
        held = sql(project, HELD)
        started = time.monotonic()
        project.compose("stop", "worker", timeout=stop_after + 90)
        took = time.monotonic() - started
        jobs_after = _statuses(project, "embedding_jobs", [r[0] for r in held])
        attempts_after = _statuses(project, "trioindex_job_attempts", [r[1] for r in held])
        rows = sql(
            project,
            "SELECT DISTINCT ON (hostname) hostname, status FROM indexing_workers "
            f"WHERE hostname IN ({_quoted(sorted(hosts))}) ORDER BY hostname, started_at DESC",
        )
        exits = {n: project.inspect(n)["State"]["ExitCode"] for n in workers}
    finally:
        _embedder_mode(project, "normal")
    started = time.monotonic()
    project.compose("start", "worker", timeout=120)
    _until("the workers RUNNING again", lambda: hosts <= _live_workers(project), 90)
    waited = _until("every job SUCCEEDED after the start", lambda: _all_succeeded(project))
    restart = time.monotonic() - started
    shutil.rmtree(folder)
    return {
        "ok": bool(held)
        and set(jobs_after) == {"PENDING"}
        and set(attempts_after) == {"CANCELLED"}
        and {status for _, status in rows} == {"STOPPED"}
        and len(rows) == len(hosts)
        and took < min(grace + 10, stop_after)
        and set(exits.values()) == {0},
        "jobs held when stopped": len(held),
        "those jobs right after the stop": sorted(set(jobs_after)),
        "their attempts": sorted(set(attempts_after)),
        "worker rows": dict(rows),
        "compose stop worker took (s)": round(took, 1),
        "grace period (s)": grace,
        "stop_grace_period (s)": stop_after,
        "container exit codes": exits,
        "compose start worker -> all SUCCEEDED (s)": round(restart, 1),
        "of which waiting for the jobs (s)": round(waited, 1),
    }


def check_kill(project: ComposeProject) -> dict[str, Any]:
    victim = _workers(project)[0]
    host = _hostname(project, victim)
    slots = _slots(project)
    folder = _documents("kill-", slots * len(_workers(project)) * 2, "kill")
    _embedder_mode(project, "hang")
    try:
        project.run_cli(folder, "ingest", "/in")
        _until(
            f"{victim} holding {slots} jobs",
            lambda: sum(1 for r in sql(project, HELD) if r[2] == host) >= slots,
            90,
        )
        held = [r for r in sql(project, HELD) if r[2] == host]
        project.engine.command("kill", "--signal", "KILL", victim, timeout=60)
        state = project.inspect(victim)["State"]
        exit_code = state["ExitCode"]
        # compose.yaml keeps the 5-minute default lease: expire the dead worker's leases now
        # rather than wait for them (the recovery itself is the workers' own).
        sql(project, "UPDATE embedding_jobs SET lease_expires_at = now() "
                     f"WHERE id IN ({_quoted([r[0] for r in held])})")  # fmt: skip
    finally:
        _embedder_mode(project, "normal")
    waited = _until("every job SUCCEEDED after the kill", lambda: _all_succeeded(project), 240)
    old_attempts = _statuses(project, "trioindex_job_attempts", [r[1] for r in held])
    finishers = sql(
        project,
        "SELECT w.hostname FROM trioindex_job_attempts a "
        "JOIN indexing_workers w ON w.id = a.worker_id "
        f"WHERE a.status = 'SUCCEEDED' AND a.embedding_job_id IN ({_quoted([r[0] for r in held])})",
    )
    restarted = project.inspect(victim)["RestartCount"]
    shutil.rmtree(folder)
    # Back to three live workers for the checks after this one.
    project.compose("start", "worker", timeout=120)
    _until(f"{victim} RUNNING again", lambda: set(_hosts(project)) <= _live_workers(project), 90)
    return {
        "ok": bool(held)
        and exit_code == 137
        and set(old_attempts) == {"EXPIRED"}
        and len(finishers) == len(held),
        "killed container": victim,
        "exit code": exit_code,
        "jobs it held": len(held),
        "their attempts afterwards": sorted(set(old_attempts)),
        "finished by": sorted({r[0] for r in finishers}),
        "killed worker's hostname": host,
        "engine restarts of the killed container": restarted,
        "recovered and all SUCCEEDED within (s)": round(waited, 1),
    }


def _hosts(project: ComposeProject) -> dict[str, str]:
    """Hostname -> container, for the worker containers that are running."""
    found = {}
    for name in _workers(project):
        details = project.inspect(name)
        if details["State"].get("Running"):
            found[str(details["Config"]["Hostname"])] = name
    return found


def _live_workers(
    project: ComposeProject, since: str = "now() - interval '15 seconds'"
) -> set[str]:
    """Hostnames of RUNNING worker rows whose heartbeat is later than ``since`` (SQL)."""
    rows = sql(
        project,
        "SELECT hostname FROM indexing_workers "
        f"WHERE status = 'RUNNING' AND last_heartbeat_at > {since}",
    )
    return {r[0] for r in rows}


def _worker_starts(project: ComposeProject) -> dict[str, tuple[str, int]]:
    found = {}
    for name in _workers(project):
        details = project.inspect(name)
        found[name] = (str(details["State"]["StartedAt"]), int(details["RestartCount"]))
    return found


def check_db_restart(project: ComposeProject) -> dict[str, Any]:
    """Jobs queued, PostgreSQL restarted under them, more jobs after: all SUCCEEDED, and every
    running worker container (not restarted) heartbeating into the restarted server."""
    before = _worker_starts(project)
    hosts = set(_hosts(project))
    total_before = len(sql(project, "SELECT 1 FROM embedding_jobs"))
    queued = _documents("dbrestart-", 12, "database restart")
    after = _documents("dbafter-", 6, "after the database restart")
    _embedder_mode(project, "slow", 0.5)
    try:
        project.run_cli(queued, "ingest", "/in")
        started = time.monotonic()
        project.compose("restart", "--no-deps", "db", timeout=120)
        restart_took = time.monotonic() - started
        project.wait_healthy("db", project.container_names("db")[0])
    finally:
        _embedder_mode(project, "normal")
    back = sql(project, "SELECT pg_postmaster_start_time()")[0][0]
    heartbeats = _until(
        "every worker heartbeating after the restart",
        lambda: hosts <= _live_workers(project, f"'{back}'::timestamptz"),
        60,
    )
    project.run_cli(after, "ingest", "/in", "--wait")
    waited = _until("every job SUCCEEDED after the restart", lambda: _all_succeeded(project))
    total = len(sql(project, "SELECT 1 FROM embedding_jobs"))
    now = _worker_starts(project)
    shutil.rmtree(queued)
    shutil.rmtree(after)
    restarted = sorted(n for n in now if now[n] != before[n])
    return {
        "ok": total == total_before + 18 and _all_succeeded(project) and not restarted,
        "compose restart --no-deps db took (s)": round(restart_took, 1),
        "jobs before / added / after": [total_before, 18, total],
        "jobs": _jobs(project),
        "workers heartbeating after the restart": sorted(hosts),
        "first heartbeats after the restart within (s)": round(heartbeats, 1),
        "worker containers restarted": restarted,
        "all SUCCEEDED, waited (s)": round(waited, 1),
    }


def check_scale(project: ComposeProject) -> dict[str, Any]:
    first = set(_workers(project))
    started = time.monotonic()
    project.compose("up", "--detach", "--no-deps", "--no-recreate", "--scale", "worker=6",
                    "worker", timeout=300)  # fmt: skip
    workers = _workers(project)
    hosts = {_hostname(project, n): n for n in workers}
    _until("six workers RUNNING", lambda: set(hosts) <= _live_workers(project), 90)
    scaled = time.monotonic() - started
    folder = _documents("scale-", 36, "scale")
    _embedder_mode(project, "slow", 0.3)
    try:
        project.run_cli(folder, "ingest", "/in", "--wait")
    finally:
        _embedder_mode(project, "normal")
    rows = sql(
        project,
        "SELECT w.hostname, count(*) FROM trioindex_job_attempts a "
        "JOIN indexing_workers w ON w.id = a.worker_id "
        "JOIN embedding_jobs j ON j.id = a.embedding_job_id "
        "JOIN document_versions v ON v.id = j.document_version_id "
        "JOIN documents d ON d.id = v.document_id "
        "WHERE a.status = 'SUCCEEDED' AND d.external_key LIKE '%scale-%' GROUP BY 1",
    )
    per_host = {h: int(n) for h, n in rows}
    new = {h for h, n in hosts.items() if n not in first}
    shutil.rmtree(folder)
    return {
        "ok": len(workers) == 6
        and len(hosts) == 6
        and sum(per_host.values()) == 36
        and bool(new & set(per_host))
        and _all_succeeded(project),
        "worker containers": len(workers),
        "distinct hostnames RUNNING": len(set(hosts) & _live_workers(project)),
        "scale-up to six RUNNING (s)": round(scaled, 1),
        "36 new documents, succeeded attempts per worker": {
            f"{h}{' (new)' if h in new else ''}": per_host.get(h, 0) for h in sorted(hosts)
        },
    }
