"""Build the image and run compose.yaml's deployment on this machine; check it; tear it down.

    python -m deploy.stack up       # build, start every service, wait until healthy; keep it
    python -m deploy.stack check    # build, start, check, always tear down (just deploy-test)
    python -m deploy.stack down     # stop and remove the project's containers, network, volumes

With Docker (the default; deploy/dockerd.py installs docker.io and Compose v2 as root when missing
and runs a private engine): Docker Compose itself on the unmodified compose.yaml, see
deploy/compose_stack.py and deploy/compose_run.py. Where Docker cannot run (or with
``TRIOINDEX_DEPLOY_ENGINE=podman``): podman (installed with apt-get as root when missing) with the
settings in deploy/engine.py, and compose.yaml's services (read with PyYAML: image, entrypoint,
command, environment, healthcheck, depends_on conditions, replicas, init, stop signal and grace
period, restart, volumes) started in dependency order by deploy/compose.py. Substituted, for
this test only:

- ``pgvector/pgvector:*`` -> PostgreSQL 17 + pgvector from Debian trixie's packages (only when no
  registry answers);
- ``minio/minio:*`` -> moto's S3 server; ``minio/mc:*`` -> a small ``mc ready``/``mc mb``;
- ``text-embeddings-inference:*`` -> the project's fake embedding server (no model download);
- the Dockerfile's base images -> Debian-built stand-ins (only when no registry answers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deploy import checks, compose_run
from deploy.compose import Project, load
from deploy.engine import Engine, EngineUnavailable, detect, log, state_dir
from deploy.images import (
    PGVECTOR,
    PROJECT_IMAGE,
    SERVICE_STANDINS,
    BaseImages,
    base_images,
    build_project,
    build_standins,
    registry_reachable,
)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"


def project_for(
    engine: Engine, env: dict[str, str], *, registry: bool, name: str | None = None
) -> Project:
    model = load(COMPOSE, env)
    standins = dict(SERVICE_STANDINS)
    if not registry:
        standins[PGVECTOR[0]] = PGVECTOR[1]
    images: dict[str, str] = {}
    entrypoints: dict[str, list[str]] = {}
    for service, spec in model["services"].items():
        image = str(spec.get("image", ""))
        if "build" in spec:
            if image != PROJECT_IMAGE:
                raise ValueError(f"{service} builds {image!r}; deploy/ builds {PROJECT_IMAGE}")
            images[service] = PROJECT_IMAGE
            continue
        for prefix, (standin, entrypoint) in standins.items():
            if image.startswith(prefix):
                images[service] = standin
                if entrypoint is not None:
                    entrypoints[service] = entrypoint
                break
        else:
            images[service] = image
    return Project(
        engine=engine,
        name=name or str(model.get("name", "trioindex")),
        model=model,
        images=images,
        entrypoints=entrypoints,
        state=state_dir(),
    )


def build_all(engine: Engine, *, registry: bool) -> dict[str, float]:
    """Base stand-ins (when needed), the project image, the service stand-ins; seconds each."""
    times: dict[str, float] = {}
    started = time.monotonic()
    bases: BaseImages = base_images(engine, use_standins=not registry)
    times["base images"] = time.monotonic() - started
    times["project image"] = build_project(engine, bases)
    started = time.monotonic()
    build_standins(engine, bases, need_pgvector=not registry)
    times["stand-in images"] = time.monotonic() - started
    return times


def check_env() -> dict[str, str]:
    """compose.yaml's interpolation for the check: its defaults, except fresh random passwords,
    so the log scan looks for values nobody typed."""
    return {
        "POSTGRES_PASSWORD": secrets.token_urlsafe(18),
        "MINIO_ROOT_PASSWORD": secrets.token_urlsafe(18),
    }


def versions(engine: Engine) -> dict[str, str]:
    found = {"engine": f"{engine.name} {engine.version()}", "host": platform.platform()}
    if engine.name == "podman":
        info = engine.command("info", "--format", "json", timeout=60, check=False)
        if info.returncode == 0:
            data = json.loads(info.stdout)
            host = data.get("host", {})
            found["runtime"] = " ".join(
                str(host.get("ociRuntime", {}).get(k, "")) for k in ("name", "version")
            ).split("\n")[0]
            found["network backend"] = str(host.get("networkBackend", ""))
            found["buildah"] = str(data.get("version", {}).get("BuildahVersion", ""))
    size = engine.command(
        "image", "inspect", "--format", "{{.Size}}", PROJECT_IMAGE, timeout=60, check=False
    ).stdout.strip()
    if size.isdigit():
        found["project image size"] = f"{int(size) / 1e6:.0f} MB"
    return found


def _docker_wanted() -> bool:
    return os.environ.get("TRIOINDEX_DEPLOY_ENGINE", "") in ("", "docker")


def cmd_up(args: argparse.Namespace) -> int:
    if _docker_wanted():
        try:
            reach = compose_run.up()
            log(f"up; reach it with `{reach}`, stop it with `python -m deploy.stack down`")
            return 0
        except EngineUnavailable as error:
            log(f"Docker Compose cannot run here ({error}); podman instead")
    engine = detect()
    registry = registry_reachable()
    times = build_all(engine, registry=registry)
    project = project_for(engine, dict(os.environ), registry=registry, name=args.project)
    project.down()
    try:
        project.up()
        for name in project.container_names("worker"):
            project.wait_healthy("worker", name)
    except BaseException:
        project.down()
        raise
    built = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    log(f"up ({built}); stop it with `python -m deploy.stack down`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if _docker_wanted():
        compose_run.down()
    try:
        engine = detect(install=False, env={"TRIOINDEX_DEPLOY_ENGINE": "podman"})
    except EngineUnavailable:
        return 0
    project_for(engine, dict(os.environ), registry=True, name=args.project).down()
    return 0


def check_podman(args: argparse.Namespace) -> dict[str, Any]:
    """The fallback where Docker cannot run: podman, with deploy/compose.py starting the
    containers compose.yaml describes (podman-compose cannot honour the file)."""
    started = time.monotonic()
    engine = detect(install=not args.no_install)
    registry = registry_reachable()
    times = build_all(engine, registry=registry)
    env = check_env()
    project = project_for(engine, env, registry=registry, name=args.project)
    result: dict[str, Any] = {
        "engine": "podman (compose.yaml read by deploy/compose.py)",
        "registry reachable": registry,
        "images": dict(project.images),
    }
    project.before_start = lambda service: checks.before_start(project, service)
    project.down()  # whatever an interrupted run left
    try:
        up_started = time.monotonic()
        project.up()
        times["stack up (all healthy)"] = time.monotonic() - up_started
        result["checks"] = checks.run_all(project, secrets=list(env.values()))
    finally:
        down_started = time.monotonic()
        project.down()
        times["down"] = time.monotonic() - down_started
    times["total"] = time.monotonic() - started
    result["seconds"] = {k: round(v, 1) for k, v in times.items()}
    result["versions"] = versions(engine)
    result["ok"] = all(c["ok"] for c in result["checks"].values())
    return result


def cmd_check(args: argparse.Namespace) -> int:
    """Docker + Compose v2 on the unmodified compose.yaml; podman where Docker cannot run
    (``TRIOINDEX_DEPLOY_ENGINE=docker|podman`` picks one)."""
    wanted = os.environ.get("TRIOINDEX_DEPLOY_ENGINE", "")
    result: dict[str, Any] | None = None
    if _docker_wanted():
        try:
            result = compose_run.run(check_env(), install=not args.no_install)
        except EngineUnavailable as error:
            if wanted == "docker":
                print(json.dumps({"ok": False, "skipped": str(error)}))
                return 3
            log(f"Docker Compose cannot run here ({error}); podman instead")
    if result is None:
        try:
            result = check_podman(args)
        except EngineUnavailable as error:
            print(json.dumps({"ok": False, "skipped": str(error)}))
            return 3
    text = json.dumps(result, indent=2)
    print(text)
    (state_dir() / "last-check.json").write_text(text + "\n", encoding="utf-8")
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack", description=__doc__)
    parser.add_argument("--project", help="project name (default: compose.yaml's name)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="build and start the stack, keep it running")
    check = sub.add_parser("check", help="build, start, check, tear down")
    check.add_argument("--output", help="also write the JSON result here")
    check.add_argument(
        "--no-install", action="store_true", help="never apt-get install docker.io or podman"
    )
    sub.add_parser("down", help="remove the project's containers, network and volumes")
    args = parser.parse_args(argv)
    handler = {"up": cmd_up, "check": cmd_check, "down": cmd_down}[args.command]
    try:
        return handler(args)
    except (RuntimeError, TimeoutError, ValueError, subprocess.TimeoutExpired) as error:
        log(f"failed: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
