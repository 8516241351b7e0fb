"""The install: the local model's torch is the CPU-only build, and ``just setup`` installs once.

``just setup`` is run for real from a copy of the justfile, with stand-ins for the two
installers it calls (``uv`` and ``python3.11 -m pip``) that only record their arguments: the
recipe's own logic (the stamp, the CPU index fallback) is what is under test, not the installers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-local.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pinned(name: str) -> Requirement:
    for text in REQUIREMENTS.read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if line and not line.startswith("-") and Requirement(line).name == name:
            return Requirement(line)
    raise AssertionError(f"{name} is not in {REQUIREMENTS.name}")


def test_the_torch_pin_asks_for_the_cpu_only_build() -> None:
    (spec,) = pinned("torch").specifier
    assert spec.operator == "==" and Version(spec.version).local == "cpu", spec


def test_the_readme_gives_the_cpu_index_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"pip install --extra-index-url {CPU_INDEX} -r requirements-local.txt" in readme
    assert CPU_INDEX in (ROOT / "justfile").read_text()


@pytest.mark.slow
def test_the_local_requirements_resolve_to_a_cpu_build_without_nvidia_packages(
    tmp_path: Path,
) -> None:
    """pip resolves the file as ``just setup`` installs it (pip's own configuration, the package
    index only); nothing is installed (``--dry-run``), every package is resolved afresh."""
    pip = shutil.which("python3.11") or sys.executable
    report = tmp_path / "report.json"
    result = subprocess.run(
        [pip, "-m", "pip", "--python", sys.executable, "install", "--dry-run", "--quiet",
         "--ignore-installed", "--report", str(report), "-r", str(REQUIREMENTS)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert Version(resolved["torch"]).local == "cpu", resolved["torch"]
    cuda = sorted(n for n in resolved if n.startswith(("nvidia-", "triton", "cuda-")))
    assert not cuda, cuda
    assert "sentence-transformers" in resolved


FAKE_INSTALLER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$INSTALL_LOG"
[[ $(basename "$0") == uv ]] && mkdir -p .venv
# pip: only the CPU index has a +cpu torch in this stand-in world, unless told otherwise
[[ $(basename "$0") == uv || -n "${LOCAL_CPU_WHEEL:-}" || "$*" == *--extra-index-url* ]]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("justfile", "uv.lock", "pyproject.toml", "requirements-local.txt"):
        shutil.copy(ROOT / name, folder / name)
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name in ("uv", "python3.11"):
        (fakes / name).write_text(FAKE_INSTALLER)
        (fakes / name).chmod(0o755)
    return folder


def real_just() -> str:
    """``just`` itself: a pyenv shim would put pyenv's own folder (with the real ``uv``) first on
    the PATH of the recipe."""
    just = shutil.which("just")
    assert just is not None, "just is not installed"
    if "/shims/" in just:
        found = subprocess.run(
            ["pyenv", "which", "just"], capture_output=True, text=True, check=True
        )
        just = found.stdout.strip()
    return just


def setup(project: Path, **env: str) -> list[str]:
    """``just setup`` in ``project``; the installer calls it made."""
    log = project.parent / "install.log"
    log.unlink(missing_ok=True)
    just = real_just()
    path = f"{project.parent / 'bin'}:{os.environ['PATH']}"
    result = subprocess.run(
        [just, "setup"],
        cwd=project,
        env={**os.environ, "PATH": path, "INSTALL_LOG": str(log), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_setup_installs_once_and_again_only_when_a_lock_file_changes(project: Path) -> None:
    first = setup(project, LOCAL_CPU_WHEEL="1")
    assert [c.split()[:2] for c in first] == [["uv", "sync"], ["python3.11", "-m"]]
    assert "-r requirements-local.txt" in first[1] and "--extra-index-url" not in first[1]
    assert "--compile-bytecode" in first[0].split()  # no process compiles modules at its start
    assert setup(project) == []  # set up: nothing runs
    assert setup(project) == []
    with (project / "requirements-local.txt").open("a") as out:
        out.write("# changed\n")
    assert [c.split()[0] for c in setup(project, LOCAL_CPU_WHEEL="1")] == ["uv", "python3.11"]
    assert setup(project) == []
    (project / ".venv" / ".setup-stamp").unlink()
    assert len(setup(project, LOCAL_CPU_WHEEL="1")) == 2


def test_setup_falls_back_to_the_pytorch_cpu_index_when_no_cpu_wheel_is_at_hand(
    project: Path,
) -> None:
    calls = setup(project)
    assert len(calls) == 3 and calls[0].startswith("uv sync")
    assert "--extra-index-url" not in calls[1]
    assert f"--extra-index-url {CPU_INDEX}" in calls[2]


def test_setup_says_what_it_installs_the_first_time_only(project: Path) -> None:
    path = f"{project.parent / 'bin'}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "INSTALL_LOG": str(project.parent / "i.log")}
    said = []
    for _ in range(2):
        done = subprocess.run(
            [real_just(), "setup"], cwd=project, env={**env, "LOCAL_CPU_WHEEL": "1"},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        said.append(done.stderr.strip())
    assert said == [
        "setting up .venv: the locked environment and CPU-only torch (about a minute, once)",
        "",
    ]
