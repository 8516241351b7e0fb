"""Images: local stand-in base images when no registry answers, the project image, and the
stand-in service images the test uses in place of pgvector (when unreachable), MinIO and TEI.

The production names stay in Dockerfile and compose.yaml; stand-ins are passed as build
arguments (``PYTHON_IMAGE``, ``UV_IMAGE``) and as this test's own image names, never tagged
under a registry's name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from deploy.engine import Engine, apt_install, apt_mirror, log, state_dir

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "standins"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

PROJECT_IMAGE = "trioindex:local"
STANDIN_PREFIX = "localhost/trioindex-standin"
# Debian's python3.11 in place of python:3.11-slim-*, uv's binary in place of the uv image.
STANDIN_DEBIAN = "localhost/debian:{suite}"
STANDIN_PYTHON = f"{STANDIN_PREFIX}-python:3.11-bookworm"
STANDIN_UV = f"{STANDIN_PREFIX}-uv:{{version}}"
STANDIN_PGVECTOR = f"{STANDIN_PREFIX}-pgvector:pg17-trixie"
STANDIN_SERVICES = f"{STANDIN_PREFIX}-services:test"

BUILD_TIMEOUT = 1800

# compose image (prefix) -> (stand-in image, entrypoint that makes it behave like the original)
SERVICE_STANDINS: dict[str, tuple[str, list[str] | None]] = {
    "minio/minio:": (STANDIN_SERVICES, ["minio"]),
    "minio/mc:": (STANDIN_SERVICES, ["mc"]),
    "ghcr.io/huggingface/text-embeddings-inference:": (
        STANDIN_SERVICES,
        ["text-embeddings-router"],
    ),
}
PGVECTOR = ("pgvector/pgvector:", (STANDIN_PGVECTOR, None))
# Stood in even when a registry answers: the checks steer the fake embedder (hang, slow), and the
# real server downloads its model's weights (2.3 GB) on first start.
ALWAYS_STOOD_IN = "ghcr.io/huggingface/text-embeddings-inference:"


@dataclass(frozen=True)
class BaseImages:
    python: str
    uv: str
    standins: bool  # True when the bases above are local stand-ins


def registry_reachable(timeout: float = 5.0) -> bool:
    """Do Docker Hub and ghcr.io answer the registry API (a 401 with the v2 header counts)?"""
    for url in ("https://registry-1.docker.io/v2/", "https://ghcr.io/v2/"):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                headers = response.headers
        except urllib.error.HTTPError as error:
            headers = error.headers
        except (OSError, ValueError):
            return False
        if not headers.get("Docker-Distribution-Api-Version", "").startswith("registry/2"):
            return False
    return True


def dockerfile_defaults() -> dict[str, str]:
    """The ``ARG NAME=default`` values before the first FROM (the production base images)."""
    found = {}
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("FROM"):
            break
        if match := re.match(r"ARG\s+([A-Z_]+)=(\S+)", line):
            found[match[1]] = match[2]
    return found


def image_exists(engine: Engine, name: str) -> bool:
    done = engine.command("image", "inspect", "--format", "{{.Id}}", name, timeout=60, check=False)
    return done.returncode == 0


def build_args(engine: Engine, *, pypi: bool = True) -> list[str]:
    """Flags every build here gets: docker format (keeps HEALTHCHECK) and, for builds that reach
    PyPI, the host's CA bundle and a uv.toml with ``system-certs`` mounted read-only into RUN
    steps, so uv gets through an intercepting TLS proxy. (Not for apt-only builds: a read-only
    bundle at its own path breaks the ca-certificates package's set-up.)"""
    if engine.name != "podman":
        return []
    if not pypi:
        return ["--format", "docker", "--pull=missing"]
    uv_toml = state_dir() / "uv.toml"
    uv_toml.write_text("system-certs = true\n", encoding="utf-8")
    args = ["--format", "docker", "--pull=missing", "--volume", f"{uv_toml}:/etc/uv/uv.toml:ro"]
    if HOST_CA_BUNDLE.is_file():
        args += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    return args


def _debian(engine: Engine, suite: str) -> str:
    name = STANDIN_DEBIAN.format(suite=suite)
    if image_exists(engine, name):
        return name
    apt_install("debootstrap")
    mirror = apt_mirror()
    log(f"debootstrap --variant=minbase {suite} from {mirror} -> {name}")
    with tempfile.TemporaryDirectory(prefix=f"debootstrap-{suite}-", dir=state_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap {suite}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        # Leave out the package lists; images run apt-get update themselves.
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(
            [engine.exe, "import", "-", name],
            stdin=tar.stdout,
            capture_output=True,
            env={**os.environ, **engine.env},
            timeout=600,
            check=False,
        )
        tar.stdout.close()
        tar.wait(timeout=60)
        if imported.returncode != 0:
            raise RuntimeError(f"import {name}: {imported.stderr.decode()[-2000:]}")
    return name


def _uv_binary(version: str, dest: Path) -> None:
    """uv's static (musl) binary from its PyPI wheel, fetched with pip."""
    with tempfile.TemporaryDirectory(prefix="uv-wheel-") as tmp:
        done = subprocess.run(
            [
                "python3", "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary", ":all:", "--platform", "musllinux_1_1_x86_64",
                "--python-version", "3.11", "--dest", tmp, f"uv=={version}",
            ],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pip download uv=={version}: {done.stderr[-1500:]}")
        (wheel,) = Path(tmp).glob("uv-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(".data/scripts/uv"))
            dest.write_bytes(archive.read(member))
    dest.chmod(0o755)


def base_images(engine: Engine, *, use_standins: bool | None = None) -> BaseImages:
    """The Dockerfile's own bases when a registry answers, else local stand-ins (made once)."""
    defaults = dockerfile_defaults()
    if use_standins is None:
        use_standins = not registry_reachable()
    if not use_standins:
        return BaseImages(defaults["PYTHON_IMAGE"], defaults["UV_IMAGE"], standins=False)
    uv_version = defaults["UV_IMAGE"].rpartition(":")[2]
    uv_image = STANDIN_UV.format(version=uv_version)
    if not image_exists(engine, uv_image):
        log(f"no registry: {uv_image} from the uv {uv_version} wheel on PyPI")
        with tempfile.TemporaryDirectory(prefix="uv-image-", dir=state_dir()) as tmp:
            _uv_binary(uv_version, Path(tmp) / "uv")
            (Path(tmp) / "Dockerfile").write_text("FROM scratch\nCOPY uv /uv\n")
            engine.stream(
                ["build", *build_args(engine, pypi=False), "-t", uv_image, tmp], timeout=600
            )
    if not image_exists(engine, STANDIN_PYTHON):
        debian = _debian(engine, "bookworm")
        log(f"no registry: {STANDIN_PYTHON} (Debian's python3.11 on {debian})")
        with tempfile.TemporaryDirectory(prefix="python-image-", dir=state_dir()) as tmp:
            bundle = Path(tmp) / "host-ca-bundle.crt"
            if HOST_CA_BUNDLE.is_file():
                shutil.copyfile(HOST_CA_BUNDLE, bundle)
            else:  # Debian's own bundle alone
                bundle.write_text("", encoding="utf-8")
            engine.stream(
                [
                    "build", *build_args(engine, pypi=False), "--build-arg", f"BASE={debian}",
                    "-t", STANDIN_PYTHON, "-f", str(STANDINS / "python.Containerfile"), tmp,
                ],
                timeout=BUILD_TIMEOUT,
            )  # fmt: skip
    return BaseImages(STANDIN_PYTHON, uv_image, standins=True)


def build_project(engine: Engine, bases: BaseImages) -> float:
    """Build trioindex:local from the repository's Dockerfile; returns the seconds it took."""
    started = time.monotonic()
    args = ["build", *build_args(engine), "-t", PROJECT_IMAGE]
    if bases.standins:
        args += ["--build-arg", f"PYTHON_IMAGE={bases.python}"]
        args += ["--build-arg", f"UV_IMAGE={bases.uv}"]
    engine.stream([*args, "-f", str(ROOT / "Dockerfile"), str(ROOT)], timeout=BUILD_TIMEOUT)
    return time.monotonic() - started


def _fake_embed_server() -> Path:
    """tests' fake embedding server, wherever the restructuring put it."""
    for folder in ("testkit", "tests/fakes", "tests"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if "class FakeEmbedServer" in path.read_text(encoding="utf-8"):
                return path
    raise FileNotFoundError("no module defines class FakeEmbedServer under testkit/ or tests/")


def _constraints() -> str:
    """Every version in uv.lock, so moto[server] is installed at the locked versions."""
    done = subprocess.run(
        ["uv", "export", "--frozen", "--all-groups", "--no-hashes", "--no-header",
         "--no-annotate", "--no-emit-project"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"uv export: {done.stderr}")
    return done.stdout


def build_standins(engine: Engine, bases: BaseImages, *, need_pgvector: bool) -> None:
    """The services stand-in (moto's S3 server, the fake TEI, `mc`) and, when the registry is
    out of reach, PostgreSQL 17 + pgvector from Debian trixie's packages."""
    with tempfile.TemporaryDirectory(prefix="standins-", dir=state_dir()) as tmp:
        context = Path(tmp)
        for path in STANDINS.iterdir():
            if path.is_file():
                shutil.copy2(path, context / path.name)
        shutil.copy2(_fake_embed_server(), context / "embed_server.py")
        (context / "constraints.txt").write_text(_constraints(), encoding="utf-8")
        digest = hashlib.sha256()
        for path in sorted(context.iterdir()):
            digest.update(path.name.encode() + path.read_bytes())
        log(f"building {STANDIN_SERVICES} (context {digest.hexdigest()[:12]})")
        engine.stream(
            [
                "build", *build_args(engine), "--build-arg", f"BASE={PROJECT_IMAGE}",
                "--build-arg", f"UV_IMAGE={bases.uv}", "-t", STANDIN_SERVICES,
                "-f", str(context / "services.Containerfile"), str(context),
            ],
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip
        if need_pgvector:
            trixie = _debian(engine, "trixie")
            log(f"building {STANDIN_PGVECTOR} (postgresql-17-pgvector on {trixie})")
            engine.stream(
                [
                    "build", *build_args(engine, pypi=False), "--build-arg", f"BASE={trixie}",
                    "-t", STANDIN_PGVECTOR, "-f", str(context / "pgvector.Containerfile"),
                    str(context),
                ],
                timeout=BUILD_TIMEOUT,
            )  # fmt: skip
