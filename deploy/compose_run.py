"""One deployment check with Docker Compose: the private engine, the images, ``docker compose
up`` on the unmodified compose.yaml, every check, ``docker compose down -v``, the engine stopped
again when this run started it. Returns the JSON result deploy/stack.py prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from deploy import checks, compose_checks, dockerd
from deploy.compose_stack import ComposeProject, free_ports, prepare_images, project_for
from deploy.engine import Engine, log
from deploy.images import PROJECT_IMAGE, registry_reachable


def _steps(project: ComposeProject, secrets: list[str]) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("migrate once, before the workers", lambda: checks.check_migrate(project)),
        ("workers registered by hostname", lambda: checks.check_registration(project)),
        ("ingest through the image's CLI", lambda: checks.check_ingest(project)),
        ("health checks green", lambda: check_health(project)),
        ("compose stop worker hands jobs back", lambda: compose_checks.check_compose_stop(project)),
        ("kill -s KILL one worker: jobs recovered", lambda: compose_checks.check_kill(project)),
        ("compose restart db: nothing lost", lambda: compose_checks.check_db_restart(project)),
        ("--scale worker=6 shares the queue", lambda: compose_checks.check_scale(project)),
        ("compose logs hold no secrets or tokens", lambda: checks.check_logs(project, secrets)),
    ]


def check_health(project: ComposeProject) -> dict[str, Any]:
    """Docker's own health state of every long-running container, after ``up --wait``."""
    states: dict[str, str] = {}
    for service, spec in project.services.items():
        if (spec.get("healthcheck") or {}).get("disable") or spec.get("restart") == "no":
            continue
        for name in project.container_names(service):
            health = project.inspect(name)["State"].get("Health") or {}
            states[name] = str(health.get("Status", "none"))
    return {"ok": bool(states) and set(states.values()) == {"healthy"}, "health": states}


def versions(engine: Engine) -> dict[str, str]:
    server = engine.command("version", "--format", "{{.Server.Version}}", timeout=30).stdout
    compose = engine.command("compose", "version", "--short", timeout=30).stdout
    size = engine.command("image", "inspect", "--format", "{{.Size}}", PROJECT_IMAGE,
                          timeout=60, check=False).stdout.strip()  # fmt: skip
    found = {
        "engine": f"docker {server.strip()} (dockerd, private socket and data root)",
        "compose": f"Docker Compose {compose.strip()}",
        "client": f"docker {engine.version()} ({engine.exe})",
    }
    if size.isdigit():
        found["project image size"] = f"{int(size) / 1e6:.0f} MB"
    return found


def _engine(variables: dict[str, str]) -> Engine:
    exe = dockerd.client()
    assert exe is not None
    return Engine("docker", exe, {**dockerd.client_env(), **variables})


def up() -> str:
    """Start the private engine and ``docker compose up --wait`` with the environment's own
    variables (compose.yaml's defaults otherwise); leave it running. Returns how to reach it."""
    dockerd.start()
    engine = _engine({})
    project = project_for(engine)
    prepare_images(engine, project, registry=registry_reachable())
    project.up()
    env = " ".join(f"{k}={v}" for k, v in dockerd.client_env().items())
    return f"{env} docker compose ps"


def down() -> None:
    """``docker compose down -v`` on the private engine, then stop it (if it is running)."""
    if dockerd.running():
        project_for(_engine({})).down()
    dockerd.stop()


def run(secrets: dict[str, str], *, install: bool = True) -> dict[str, Any]:
    """``secrets``: compose.yaml's password variables, set to fresh random values. Raises
    EngineUnavailable when Docker or Compose v2 cannot be had or started."""
    started = time.monotonic()
    times: dict[str, float] = {}
    we_started = dockerd.start(install=install)
    times["engine (install, start)"] = time.monotonic() - started
    engine = _engine({**secrets, **free_ports()})
    try:
        registry = registry_reachable()
        project = project_for(engine)
        prepared = prepare_images(engine, project, registry=registry)
        times.update(prepared["seconds"])
        result: dict[str, Any] = {
            "engine": "docker compose",
            "registry reachable": registry,
            "stood in (real name <- local image)": prepared["stood in"],
        }
        project.down()  # whatever an interrupted run left
        try:
            up_started = time.monotonic()
            log("docker compose up --detach --wait")
            project.up()
            times["compose up --wait (all healthy)"] = time.monotonic() - up_started
            checks.sql(project, checks.TOKEN_TRIGGER)  # before the first job exists
            result["checks"] = checks.run_steps(_steps(project, list(secrets.values())))
        finally:
            down_started = time.monotonic()
            project.down()
            times["compose down -v"] = time.monotonic() - down_started
        result["versions"] = versions(engine)
    finally:
        if we_started:
            dockerd.stop()
    times["total"] = time.monotonic() - started
    result["seconds"] = {k: round(v, 1) for k, v in times.items()}
    result["ok"] = all(c["ok"] for c in result["checks"].values())
    return result
