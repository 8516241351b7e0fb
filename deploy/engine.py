"""The container engine: docker when its daemon answers, else podman (installed with apt-get
when neither exists and we are root), with podman's settings in a private state folder.

podman on this kind of machine (Debian 12, root without CAP_SYS_RESOURCE, hybrid cgroups, no
systemd) needs: runc instead of crun, default ulimits no higher than the hard limits we have,
cgroupfs, file events, netavark (for container DNS on a user network). They go into a
``containers.conf`` named by ``CONTAINERS_CONF`` for our commands only; the system's
``/etc/containers`` is never written.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

APT_PACKAGES = ("podman", "runc", "netavark", "aardvark-dns", "iptables", "catatonit", "uidmap")


def state_dir() -> Path:
    """Private state: containers.conf, uv.toml, base root file systems, build contexts."""
    path = Path(os.environ.get("TRIOINDEX_DEPLOY_STATE", "~/.cache/trioindex-deploy"))
    path = path.expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(message: str) -> None:
    print(f"[deploy] {message}", file=sys.stderr, flush=True)


class EngineUnavailable(RuntimeError):
    """No engine can run containers here, and none could be installed."""


@dataclass
class Engine:
    name: str  # "docker" or "podman"
    exe: str
    env: dict[str, str] = field(default_factory=dict)

    def command(
        self,
        *args: str,
        timeout: float,
        check: bool = True,
        input: str | bytes | None = None,
        text: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """One engine command, bounded by ``timeout``; raises on a non-zero exit when ``check``."""
        done = subprocess.run(
            [self.exe, *args],
            env={**os.environ, **self.env},
            input=input,
            capture_output=True,
            text=text,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{self.name} {' '.join(args[:3])} ... exited {done.returncode}: "
                f"{_tail(done.stderr)}"
            )
        return done

    def stream(self, args: Sequence[str], *, timeout: float) -> None:
        """A long command (a build) with its output passed through to stderr (stdout is kept
        for the result), bounded by ``timeout``."""
        done = subprocess.run(
            [self.exe, *args],
            env={**os.environ, **self.env},
            stdout=sys.stderr,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} {' '.join(args[:2])} exited {done.returncode}")

    def version(self) -> str:
        done = self.command("version", "--format", "{{.Client.Version}}", timeout=30, check=False)
        return done.stdout.strip() or "?"


def _tail(text: str | bytes | None, lines: int = 8) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _docker_answers() -> str | None:
    exe = shutil.which("docker")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    # A docker client whose daemon does not answer (as on this machine) is no engine.
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return exe


def _limit(which: int, cap: int) -> int:
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def podman_settings(state: Path) -> dict[str, str]:
    """Write containers.conf into ``state`` and return the environment that selects it."""
    nofile = _limit(resource.RLIMIT_NOFILE, 1048576)
    nproc = _limit(resource.RLIMIT_NPROC, 32768)
    conf = state / "containers.conf"
    conf.write_text(
        "# Written by deploy/engine.py; used through CONTAINERS_CONF by deploy/ only.\n"
        "[containers]\n"
        # podman's default (1048576) is above our hard limit and root lacks CAP_SYS_RESOURCE.
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        'log_driver = "k8s-file"\n'
        "\n[engine]\n"
        # crun cannot start containers here (hybrid cgroups, no CAP_SYS_RESOURCE); runc can.
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        "\n[network]\n"
        'network_backend = "netavark"\n',
        encoding="utf-8",
    )
    return {"CONTAINERS_CONF": str(conf)}


def _install_podman() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(
            "no container engine: docker's daemon does not answer, podman is not installed, and "
            "it can only be installed here as root with apt-get"
        )
    log(f"installing {' '.join(APT_PACKAGES)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
    ):
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode != 0:
            raise EngineUnavailable(f"{' '.join(args[:2])} failed: {_tail(done.stderr)}")


def apt_install(*packages: str) -> None:
    """Install host packages (debootstrap) as root, once; a no-op when present."""
    missing = [p for p in packages if shutil.which(p) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{', '.join(missing)} missing and not installable (not root)")
    log(f"installing {' '.join(missing)} with apt-get")
    done = subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise EngineUnavailable(f"apt-get install {' '.join(missing)}: {_tail(done.stderr)}")


def apt_mirror() -> str:
    """The host's Debian mirror (deb822 or one-line sources), for debootstrap."""
    sources = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(r"^(?:URIs:|deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M):
            uri = match[1].rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def detect(*, install: bool = True, env: Mapping[str, str] | None = None) -> Engine:
    """docker if its daemon answers, else podman with our settings (installing it if allowed).

    ``TRIOINDEX_DEPLOY_ENGINE=docker|podman`` picks one. Raises :class:`EngineUnavailable`.
    """
    env = os.environ if env is None else env
    wanted = env.get("TRIOINDEX_DEPLOY_ENGINE", "")
    if wanted in ("", "docker") and (exe := _docker_answers()):
        return Engine("docker", exe)
    if wanted == "docker":
        raise EngineUnavailable("TRIOINDEX_DEPLOY_ENGINE=docker, but no docker daemon answers")
    if shutil.which("podman") is None or shutil.which("iptables") is None:
        if not install:
            raise EngineUnavailable("no docker daemon and no podman (with iptables for netavark)")
        _install_podman()
    exe = shutil.which("podman")
    if exe is None:
        raise EngineUnavailable("podman is still not on PATH after apt-get install")
    return Engine("podman", exe, podman_settings(state_dir()))
