"""A private Docker engine with Compose v2 for the deployment test, installed from packages.

    python -m deploy.dockerd install # install what is missing; print the folder holding
                                     # `docker-compose` (for PATH)
    python -m deploy.dockerd start   # install, start the daemon, print its environment
    python -m deploy.dockerd stop    # stop the daemon this folder's pid file names

What it installs, as root with apt-get and only when missing:

- ``docker.io`` (dockerd, containerd, runc; Debian 12 ships 20.10);
- Compose v2 as a Docker CLI plugin: Debian's next release carries ``docker-compose`` 2.x, a
  static Go binary. It is fetched with ``apt-get download`` from a temporary sources file (its
  own package lists, nothing added to the system's apt sources) and unpacked with ``dpkg -x``
  into ``<state>/docker-config/cli-plugins``. (Debian 12's own ``docker-compose`` is Compose v1,
  which cannot read compose.yaml's ``name:``.)

The daemon listens only on ``<state>/docker/docker.sock`` and keeps its images, containers and
run-time state under ``<state>/docker/`` (``--data-root``, ``--exec-root``), so nothing else on
the machine finds it and the system's /var/lib/docker is never used. Commands reach it through
:func:`client_env` (``DOCKER_HOST``, ``DOCKER_CONFIG``), given to our subprocesses only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.engine import EngineUnavailable, apt_mirror, log, state_dir

NEXT_DEBIAN = "trixie"
COMPOSE_PACKAGE = "docker-compose"
PLUGIN_PATH = "usr/libexec/docker/cli-plugins/docker-compose"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
START_TIMEOUT = 60.0


def docker_dir() -> Path:
    path = state_dir() / "docker"
    path.mkdir(parents=True, exist_ok=True)
    return path


def socket_path() -> Path:
    return docker_dir() / "docker.sock"


def config_dir() -> Path:
    """DOCKER_CONFIG: the CLI's settings and plugins (Compose), apart from ~/.docker."""
    path = state_dir() / "docker-config"
    (path / "cli-plugins").mkdir(parents=True, exist_ok=True)
    return path


def bin_dir() -> Path:
    """A folder with ``docker-compose`` (the plugin binary also runs standalone), for PATH."""
    path = state_dir() / "bin"
    path.mkdir(parents=True, exist_ok=True)
    return path


def client_env() -> dict[str, str]:
    """DOCKER_BUILDKIT=1: the 20.10 client builds with the daemon's BuildKit (RUN --mount)."""
    return {
        "DOCKER_HOST": f"unix://{socket_path()}",
        "DOCKER_CONFIG": str(config_dir()),
        "DOCKER_BUILDKIT": "1",
    }


def client() -> str | None:
    """The docker.io package's client, which builds with BuildKit without the buildx plugin
    (a newer client elsewhere on PATH may lack it and fall back to the legacy builder)."""
    packaged = Path("/usr/bin/docker")
    return str(packaged) if packaged.is_file() else shutil.which("docker")


def _run(args: list[str], *, timeout: float, cwd: Path | None = None) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise EngineUnavailable(f"{' '.join(args[:3])} exited {done.returncode}: {tail}")
    return done.stdout


def _need_root(what: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{what} is missing and can only be installed as root with apt-get")


def install_docker() -> None:
    """dockerd and a docker client, from Debian's docker.io, when either is missing."""
    if shutil.which("dockerd") and client():
        return
    _need_root("dockerd")
    log("installing docker.io with apt-get")
    # Waits for the dpkg lock rather than failing while another apt-get runs.
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q",
               "--no-install-recommends", "docker.io"]  # fmt: skip
    try:
        _run(install, timeout=900)
    except EngineUnavailable:
        _run(["apt-get", "update", "-q"], timeout=600)
        _run(install, timeout=900)


def _client_output(*args: str) -> str | None:
    """stdout of one docker client command against our daemon, or None when it fails."""
    docker = client()
    if docker is None:
        return None
    done = subprocess.run(
        [docker, *args],
        env={**os.environ, **client_env()},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _compose_works() -> str | None:
    version = (_client_output("compose", "version", "--short") or "").removeprefix("v")
    return version if version[:1].isdigit() and version[0] != "1" else None


def install_compose() -> str:
    """The Compose v2 plugin in our DOCKER_CONFIG (and as ``docker-compose`` in
    :func:`bin_dir`), from the next Debian release's package. Returns the Compose version."""
    version = _compose_works() or _fetch_compose()
    link = bin_dir() / "docker-compose"
    if not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(config_dir() / "cli-plugins" / "docker-compose")
    return version


def _fetch_compose() -> str:
    _need_root("Compose v2")
    if not KEYRING.is_file():
        raise EngineUnavailable(f"no {KEYRING} to check {NEXT_DEBIAN}'s package lists with")
    log(f"fetching {COMPOSE_PACKAGE} from Debian {NEXT_DEBIAN} (apt-get download + dpkg -x)")
    with tempfile.TemporaryDirectory(prefix="compose-deb-", dir=state_dir()) as tmp:
        work = Path(tmp)
        (work / "lists/partial").mkdir(parents=True)
        (work / "cache/archives/partial").mkdir(parents=True)
        sources = work / "sources.list"
        sources.write_text(
            f"deb [signed-by={KEYRING}] {apt_mirror()} {NEXT_DEBIAN} main\n",
            encoding="utf-8",
        )
        apt = [
            "-q",
            f"-o=Dir::Etc::SourceList={sources}",
            "-o=Dir::Etc::SourceParts=/dev/null",
            f"-o=Dir::State::Lists={work / 'lists'}",
            f"-o=Dir::Cache={work / 'cache'}",
            # Downloads into a root-only folder: apt's _apt user could not write there.
            "-o=APT::Sandbox::User=root",
        ]
        _run(["apt-get", *apt, "update"], timeout=600)
        _run(["apt-get", *apt, "download", COMPOSE_PACKAGE], timeout=600, cwd=work)
        (deb,) = work.glob(f"{COMPOSE_PACKAGE}_*.deb")
        _run(["dpkg", "-x", str(deb), str(work / "root")], timeout=120)
        target = config_dir() / "cli-plugins" / "docker-compose"
        shutil.copy2(work / "root" / PLUGIN_PATH, target)
        target.chmod(0o755)
    version = _compose_works()
    if version is None:
        raise EngineUnavailable(f"{COMPOSE_PACKAGE} from {NEXT_DEBIAN} does not run here")
    return version


def running() -> bool:
    """Does a daemon answer on our socket?"""
    return _answers()


def _answers() -> bool:
    return socket_path().exists() and bool(_client_output("info", "--format", "{{.ServerVersion}}"))


def start(*, install: bool = True) -> bool:
    """Install what is missing (unless ``install`` is false) and start the private daemon.
    Returns True when this call started it (so the caller stops it), False when one was already
    answering on our socket. Raises EngineUnavailable."""
    if install:
        install_docker()
        install_compose()
    elif not (shutil.which("dockerd") and _compose_works()):
        raise EngineUnavailable("no dockerd or no Compose v2, and installing is off")
    if _answers():
        return False
    home = docker_dir()
    (home / "data").mkdir(exist_ok=True)
    (home / "exec").mkdir(exist_ok=True)
    socket_path().unlink(missing_ok=True)
    command = [
        str(shutil.which("dockerd")),
        "-H", f"unix://{socket_path()}",
        "--data-root", str(home / "data"),
        "--exec-root", str(home / "exec"),
        "--pidfile", str(home / "dockerd.pid"),
    ]  # fmt: skip
    log(f"starting dockerd on {socket_path()}")
    with open(home / "dockerd.log", "ab") as out:
        # Its own session: a Ctrl-C in the caller's terminal does not reach it; stop() does.
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                         start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers():
        if time.monotonic() > deadline:
            tail = (home / "dockerd.log").read_text(errors="replace").splitlines()[-10:]
            raise EngineUnavailable("dockerd did not answer within 60 s:\n" + "\n".join(tail))
        time.sleep(0.5)
    return True


def stop() -> None:
    """Stop the daemon named by our pid file (SIGTERM; it stops its containers first)."""
    pidfile = docker_dir() / "dockerd.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log("dockerd stopped")
            return
        time.sleep(0.25)
    log(f"dockerd (pid {pid}) still running after 60 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.dockerd", description=__doc__)
    parser.add_argument("command", choices=["install", "start", "stop"])
    args = parser.parse_args(argv)
    if args.command == "stop":
        stop()
        return 0
    try:
        if args.command == "install":
            install_docker()
            install_compose()
            print(bin_dir())
            return 0
        start()
    except EngineUnavailable as error:
        log(str(error))
        return 3
    for key, value in client_env().items():
        print(f"export {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
