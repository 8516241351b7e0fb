"""compose.yaml, read as the file says, and its services started in dependency order.

Used when no Compose implementation can run the file here (podman 4.3's podman-compose ignores
``condition: service_healthy``, does not start services with dependencies and makes one replica
without ``deploy.mode``). What is taken from each service: image (or the built image), entrypoint,
command, environment, healthcheck (test, interval, timeout, retries, start_period, disable),
depends_on conditions, deploy.replicas, init, stop_signal, stop_grace_period, restart and named
volumes. Published ports are not bound (the checks run inside the network) and ``build:`` is done
once by the caller.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from deploy.engine import Engine, log

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})"
)
# An overall bound on one wait, whatever a health check's own start period says (TEI's 15 min
# covers a model download the stand-in does not make).
MAX_WAIT = 240.0


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``$$``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``, recursively."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        got = env.get(match["name"])
        if match["op"] == ":-":
            return got or match["default"]
        if match["op"] == "-":
            return match["default"] if got is None else got
        if got is None:
            raise ValueError(f"{match['name']} is unset and has no default")
        return got

    return _VARIABLE.sub(substitute, value)


def load(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    model = interpolate(yaml.safe_load(path.read_text(encoding="utf-8")), env)
    assert isinstance(model, dict)
    return model


def seconds(text: str | int | float | None, default: float) -> float:
    """A Compose duration (``45s``, ``1m30s``, ``15m``) in seconds."""
    if text is None:
        return default
    if isinstance(text, int | float):
        return float(text)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def depends_on(spec: Mapping[str, Any]) -> dict[str, str]:
    deps = spec.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (d or {}).get("condition", "service_started") for name, d in deps.items()}


def start_order(services: Mapping[str, Any]) -> list[str]:
    """Services in an order where each comes after everything it depends on."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise ValueError(f"dependency cycle: {' -> '.join((*path, name))}")
        for dep in depends_on(services[name]):
            visit(dep, (*path, name))
        done.append(name)

    for name in services:
        visit(name, ())
    return done


def _health_args(check: Mapping[str, Any] | None, engine: str) -> list[str]:
    if not check:
        return []
    if check.get("disable") or check.get("test") in (["NONE"], "NONE"):
        return ["--no-healthcheck"]
    test = check["test"]
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if engine == "docker":  # docker run takes one shell command
        cmd = test[1] if test[0] == "CMD-SHELL" else shlex.join(test[1:])
    # podman takes a JSON array, the CMD form without its "CMD".
    elif test[0] == "CMD":
        argv = test[1:]
        cmd = json.dumps(argv) if len(argv) > 1 else json.dumps(["CMD-SHELL", shlex.join(argv)])
    else:
        cmd = json.dumps(test)
    args = ["--health-cmd", cmd]
    for key, flag in (
        ("interval", "--health-interval"),
        ("timeout", "--health-timeout"),
        ("start_period", "--health-start-period"),
    ):
        if key in check:
            args += [flag, str(check[key])]
    if "retries" in check:
        args += ["--health-retries", str(check["retries"])]
    return args


@dataclass
class Container:
    service: str
    name: str


@dataclass
class Project:
    """One project's containers, network and volumes, started from the compose model."""

    engine: Engine
    name: str
    model: dict[str, Any]
    images: dict[str, str]  # service -> image to run (the built image, or a stand-in)
    entrypoints: dict[str, list[str]] = field(default_factory=dict)  # stand-ins' entrypoints
    state: Path = field(default_factory=Path)
    containers: list[Container] = field(default_factory=list)
    #: called with the service name before its containers start
    before_start: Callable[[str], None] | None = None

    @property
    def network(self) -> str:
        return f"{self.name}_default"

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return dict(self.model["services"])

    def replicas(self, service: str) -> int:
        return int((self.services[service].get("deploy") or {}).get("replicas", 1))

    def container_names(self, service: str) -> list[str]:
        return [f"{self.name}-{service}-{i}" for i in range(1, self.replicas(service) + 1)]

    def volume(self, name: str) -> str:
        return f"{self.name}_{name}"

    # -- start -----------------------------------------------------------------------------

    def up(self) -> None:
        labels = ["--label", f"com.docker.compose.project={self.name}"]
        self.engine.command("network", "create", *labels, self.network, timeout=60)
        for volume in self.model.get("volumes") or {}:
            self.engine.command("volume", "create", *labels, self.volume(volume), timeout=60)
        for service in start_order(self.services):
            self._wait_dependencies(service)
            if self.before_start is not None:
                self.before_start(service)
            for index, name in enumerate(self.container_names(service), start=1):
                self._run(service, index, name)
            log(f"started {service} x{self.replicas(service)}")

    def env_file(self, service: str) -> Path:
        """The service's environment in a 0600 file (kept off the command line)."""
        env = self.services[service].get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        path = self.state / f"{self.name}-{service}.env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for key, value in env.items():
                if "\n" in str(value):
                    raise ValueError(f"{service}: {key} holds a newline")
                out.write(f"{key}={value}\n")
        return path

    def _run(self, service: str, index: int, name: str) -> None:
        spec = self.services[service]
        args = [
            "run", "--detach", "--name", name,
            "--network", self.network, "--network-alias", service,
            "--label", f"com.docker.compose.project={self.name}",
            "--label", f"com.docker.compose.service={service}",
            "--label", f"com.docker.compose.container-number={index}",
            "--env-file", str(self.env_file(service)),
        ]  # fmt: skip
        if spec.get("init"):
            args.append("--init")
        if "stop_signal" in spec:
            args += ["--stop-signal", str(spec["stop_signal"])]
        if "stop_grace_period" in spec:
            args += ["--stop-timeout", str(round(seconds(spec["stop_grace_period"], 10)))]
        restart = str(spec.get("restart", "no"))
        args += ["--restart", restart]
        for volume in spec.get("volumes") or []:
            source, _, target = str(volume).partition(":")
            if source in (self.model.get("volumes") or {}):
                args += ["--volume", f"{self.volume(source)}:{target}"]
        args += _health_args(spec.get("healthcheck"), self.engine.name)
        entrypoint = self.entrypoints.get(service, spec.get("entrypoint"))
        if entrypoint is not None:
            if isinstance(entrypoint, str):
                entrypoint = shlex.split(entrypoint)
            args += ["--entrypoint", json.dumps(list(entrypoint))]
        command = spec.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        args += [self.images[service], *(command or [])]
        self.engine.command(*args, timeout=120)
        self.containers.append(Container(service, name))

    # -- waiting ---------------------------------------------------------------------------

    def _wait_dependencies(self, service: str) -> None:
        for dep, condition in depends_on(self.services[service]).items():
            for name in self.container_names(dep):
                if condition == "service_healthy":
                    self.wait_healthy(dep, name)
                elif condition == "service_completed_successfully":
                    self.wait_completed(dep, name)
                else:
                    self.wait_running(name)
            log(f"{service}: {dep} is {condition.removeprefix('service_')}")

    def inspect(self, name: str) -> dict[str, Any]:
        done = self.engine.command("inspect", "--format", "{{json .}}", name, timeout=60)
        found = json.loads(done.stdout)
        return dict(found[0] if isinstance(found, list) else found)

    def wait_running(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.inspect(name)["State"].get("Status") != "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} is not running after {timeout:.0f} s")
            time.sleep(0.5)

    def healthcheck(self, name: str) -> bool:
        """Run the container's own health check once (podman runs none without systemd)."""
        if self.engine.name == "podman":
            done = self.engine.command("healthcheck", "run", name, timeout=60, check=False)
            return done.returncode == 0
        state = self.inspect(name)["State"]
        return bool((state.get("Health") or {}).get("Status") == "healthy")

    def wait_healthy(self, service: str, name: str) -> float:
        """Poll the health check until it passes; bounded by its own start period + retries,
        and by MAX_WAIT. Returns the seconds waited."""
        check = self.services[service].get("healthcheck") or {}
        budget = seconds(check.get("start_period"), 0) + int(check.get("retries", 3)) * (
            seconds(check.get("interval"), 30) + seconds(check.get("timeout"), 30)
        )
        budget = min(budget, MAX_WAIT)
        started = time.monotonic()
        while not self.healthcheck(name):
            state = self.inspect(name)["State"]
            if state.get("Status") != "running":
                raise RuntimeError(f"{name} stopped ({state.get('ExitCode')}):\n{self.logs(name)}")
            if time.monotonic() - started > budget:
                raise TimeoutError(
                    f"{name} not healthy after {budget:.0f} s:\n{self.logs(name)[-3000:]}"
                )
            time.sleep(1)
        return time.monotonic() - started

    def wait_completed(self, service: str, name: str, timeout: float = MAX_WAIT) -> None:
        try:
            done = self.engine.command("wait", name, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{name} still running after {timeout:.0f} s") from None
        code = int(done.stdout.strip().splitlines()[-1])
        if code != 0:
            raise RuntimeError(f"{service} ({name}) exited {code}:\n{self.logs(name)[-3000:]}")

    def logs(self, name: str) -> str:
        done = self.engine.command("logs", name, timeout=60, check=False)
        return done.stdout + done.stderr

    def every_log(self) -> dict[str, str]:
        """Each container's log (every service), by container name."""
        return {c.name: self.logs(c.name) for c in self.containers}

    def run_cli(self, folder: Path, *args: str, timeout: float = 300) -> str:
        """`trioindex ARGS` in a one-off container of the project image, with the worker's
        environment, on the project network, with ``folder`` at /in (read-only)."""
        done = self.engine.command(
            "run", "--rm", "--network", self.network,
            "--label", f"com.docker.compose.project={self.name}",
            "--env-file", str(self.env_file("worker")),
            "--volume", f"{folder}:/in:ro",
            self.images["worker"], *args,
            timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"trioindex {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
            )
        return done.stdout

    # -- stop ------------------------------------------------------------------------------

    def down(self) -> None:
        """Stop and remove every container, the network and the volumes of this project."""
        label = f"label=com.docker.compose.project={self.name}"
        listed = self.engine.command(
            "ps", "--all", "--quiet", "--filter", label, timeout=60, check=False
        )
        ids = listed.stdout.split()
        if ids:
            self.engine.command("stop", "--time", "15", *ids, timeout=120, check=False)
            self.engine.command("rm", "--force", *ids, timeout=120, check=False)
        vols = self.engine.command(
            "volume", "ls", "--quiet", "--filter", label, timeout=60, check=False
        ).stdout.split()
        if vols:
            self.engine.command("volume", "rm", "--force", *vols, timeout=60, check=False)
        self.engine.command("network", "rm", "--force", self.network, timeout=60, check=False)
        self.containers.clear()


def timestamp(state: Mapping[str, Any], key: str) -> datetime:
    """A container's ``StartedAt``/``FinishedAt`` as an aware datetime (cut to microseconds)."""
    text = str(state[key])
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?", text)
    if not match:
        raise ValueError(f"{key}: {text!r}")
    base, frac, zone = match.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    return datetime.fromisoformat(f"{base}.{(frac or '0')[:6].ljust(6, '0')}{zone}")
