"""Shared fixtures are plugins under tests/fixtures/; what they start is in testkit/.

A command given no ``TRIOINDEX_HOME`` and run outside any project falls back to the user's data
folder (``$XDG_DATA_HOME/trioindex``): the test run gets a data folder of its own (0711, so that
the embedded server's user may pass as root), never the real one, and it is removed at the end.

When a test that wrote ``*.log`` files into its ``tmp_path`` (the process tests' workers) fails,
the last lines of each are added to its report, so a failure in CI shows what the workers said.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest
from _pytest.reports import TestReport

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


#: Lines of each of a failed test's ``*.log`` files shown in its report.
LOG_TAIL_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, TestReport, TestReport]:
    report: TestReport = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.rglob("*.log"))[:8]:
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"last lines of {log.relative_to(tmp_path)}", "\n".join(lines)))
    return report
