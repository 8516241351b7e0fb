"""compose.yaml run by Docker Compose v2 itself, unmodified, on the private engine of
deploy/dockerd.py: images, ``docker compose up``, the checks, ``docker compose down -v``.

Images. ``docker compose build`` builds the project image from the repository's Dockerfile with
its default base images. Every image compose.yaml or the Dockerfile names that the daemon lacks
is pulled by Compose when a registry answers; when none answers, a local stand-in is built and
tagged under the image's own name, in the private daemon only (deploy/images.py says which
stand-in stands for which image, and with which entrypoint). The embedding server is stood in
whatever a registry says: the checks steer the fake embedder (``/_fake/mode``), and the real one
downloads 2.3 GB of weights.

Compose reads the file with its own interpolation: the check sets fresh random passwords
(POSTGRES_PASSWORD, MINIO_ROOT_PASSWORD) and free loopback ports for the published ones
(TRIOINDEX_*_PORT), through the variables compose.yaml itself offers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.compose import Project
from deploy.engine import Engine, log, state_dir
from deploy.images import (
    ALWAYS_STOOD_IN,
    PGVECTOR,
    SERVICE_STANDINS,
    BaseImages,
    base_images,
    build_standins,
    dockerfile_defaults,
    image_exists,
)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
PORT_VARIABLES = (
    "TRIOINDEX_DB_PORT",
    "TRIOINDEX_MINIO_PORT",
    "TRIOINDEX_MINIO_CONSOLE_PORT",
    "TRIOINDEX_TEI_PORT",
    "TRIOINDEX_HTTP_PORT",
)
UP_TIMEOUT = 600


def free_ports() -> dict[str, str]:
    """A free loopback port for each published port compose.yaml lets the environment choose."""
    sockets = [socket.socket() for _ in PORT_VARIABLES]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return {v: str(s.getsockname()[1]) for v, s in zip(PORT_VARIABLES, sockets, strict=True)}
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class ComposeProject(Project):
    """The project as Docker Compose runs it; containers are found through ``compose ps``."""

    def compose(
        self, *args: str, timeout: float, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.engine.command(
            "compose", "--ansi", "never", "--project-directory", str(ROOT),
            "-f", str(COMPOSE), "-p", self.name, *args,
            timeout=timeout, check=check,
        )  # fmt: skip

    def container_names(self, service: str) -> list[str]:
        done = self.compose("ps", "--all", "--format", "json", service, timeout=60)
        text = done.stdout.strip()
        lines = text.splitlines()
        # One JSON object per line (Compose >= 2.21), or one array (older releases).
        rows = json.loads(text) if text.startswith("[") else [json.loads(x) for x in lines]
        names = [str(row["Name"]) for row in rows if row.get("Service", service) == service]
        return sorted(names, key=lambda name: int(name.rpartition("-")[2]))

    def up(self) -> None:
        """``docker compose up --detach --wait``: every service running, healthy or done."""
        self.compose("up", "--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT),
                     timeout=UP_TIMEOUT + 60)  # fmt: skip

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "15",
                     timeout=300, check=False)  # fmt: skip

    def every_log(self) -> dict[str, str]:
        done = self.compose("logs", "--no-color", timeout=120)
        return {"docker compose logs": done.stdout + done.stderr}

    def run_cli(self, folder: Path, *args: str, timeout: float = 300) -> str:
        """``docker compose run --rm --no-deps -v FOLDER:/in:ro worker ARGS``."""
        done = self.compose(
            "run", "--rm", "--no-deps", "-T", "--volume", f"{folder}:/in:ro", "worker", *args,
            timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"compose run worker {' '.join(args)} exited {done.returncode}: "
                f"{done.stderr[-2000:]}"
            )
        return done.stdout


def project_for(engine: Engine, name: str = "trioindex") -> ComposeProject:
    """The project with compose's own reading of the file (``docker compose config``)."""
    probe = ComposeProject(engine=engine, name=name, model={}, images={}, state=state_dir())
    config = probe.compose("config", "--format", "json", timeout=60)
    model: dict[str, Any] = json.loads(config.stdout)
    images = {s: str(spec.get("image", "")) for s, spec in model["services"].items()}
    return ComposeProject(
        engine=engine, name=str(model.get("name", name)), model=model, images=images,
        state=state_dir(),
    )  # fmt: skip


def _tag(engine: Engine, standin: str, name: str, entrypoint: list[str] | None) -> None:
    if entrypoint is None:
        engine.command("tag", standin, name, timeout=60)
        return
    dockerfile = f"FROM {standin}\nENTRYPOINT {json.dumps(entrypoint)}\n"
    engine.command("build", "--quiet", "-t", name, "-", input=dockerfile, timeout=300)


def prepare_images(engine: Engine, project: ComposeProject, *, registry: bool) -> dict[str, Any]:
    """Stand-ins for the bases (no registry), ``docker compose build``, stand-ins for the
    services' images. Returns seconds per step and the images stood in."""
    times: dict[str, float] = {}
    standins: dict[str, str] = {}
    started = time.monotonic()
    bases: BaseImages = base_images(engine, use_standins=not registry)
    if bases.standins:
        defaults = dockerfile_defaults()
        for arg, standin in (("PYTHON_IMAGE", bases.python), ("UV_IMAGE", bases.uv)):
            _tag(engine, standin, defaults[arg], None)
            standins[defaults[arg]] = standin
    times["base images"] = time.monotonic() - started

    started = time.monotonic()
    log("docker compose build")
    project.engine.stream(
        ["compose", "--ansi", "never", "--project-directory", str(ROOT), "-f", str(COMPOSE),
         "-p", project.name, "build"],
        timeout=1800,
    )  # fmt: skip
    times["project image (compose build)"] = time.monotonic() - started

    started = time.monotonic()
    if registry:
        wanted = {ALWAYS_STOOD_IN: SERVICE_STANDINS[ALWAYS_STOOD_IN]}
    else:
        wanted = {**SERVICE_STANDINS, PGVECTOR[0]: PGVECTOR[1]}
    build_standins(engine, bases, need_pgvector=not registry)
    for service, image in project.images.items():
        if "build" in project.services[service]:
            continue
        for prefix, (standin, entrypoint) in wanted.items():
            if image.startswith(prefix):
                _tag(engine, standin, image, entrypoint)
                standins[image] = standin + (f" (entrypoint {entrypoint})" if entrypoint else "")
                break
        else:
            if not image_exists(engine, image):
                log(f"{image}: pulled by compose")
    times["stand-in images"] = time.monotonic() - started
    return {"seconds": times, "stood in": standins}
