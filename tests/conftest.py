"""Shared fixtures are plugins under tests/fixtures/; what they start is in testkit/.

A command given no ``TRIOINDEX_HOME`` and run outside any project falls back to the user's data
folder (``$XDG_DATA_HOME/trioindex``): the test run gets a data folder of its own (0711, so that
the embedded server's user may pass as root), never the real one, and it is removed at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.embed",
    "tests.fixtures.s3",
    "tests.fixtures.database",
]

_DATA_HOME = Path(tempfile.mkdtemp(prefix="trioindex-test-data-"))
_DATA_HOME.chmod(0o711)
os.environ["XDG_DATA_HOME"] = str(_DATA_HOME)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from trioindex.db.pool import stop_embedded

    for pgdata in _DATA_HOME.rglob("pgdata"):
        stop_embedded(pgdata.parent)
    shutil.rmtree(_DATA_HOME, ignore_errors=True)
