"""The mutation catalogues (bench/mutants.py; bench/holes.toml, the reverted fixes the
interleaving test must find) still match the code they mutate.

Every mutant is a text replacement that must match its file exactly once; when the code
changes under it, this fails here, in seconds, instead of in the next ``just mutants`` run.
The catalogue is checked through its command line (``--check`` prints the problems and exits
non-zero), since tests do not import bench/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("catalogue", ["bench/mutants.toml", "bench/holes.toml"])
def test_every_mutant_matches_its_file_exactly_once(catalogue: str) -> None:
    check = subprocess.run(
        [sys.executable, "-m", "bench.mutants", "--check", "--catalogue", catalogue],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
