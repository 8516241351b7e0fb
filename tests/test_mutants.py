"""The mutation catalogue (bench/mutants.py) still matches the code it mutates.

Every mutant is a text replacement that must match its file exactly once; when the code
changes under it, this fails here, in seconds, instead of in the next ``just mutants`` run.
"""

from __future__ import annotations

from bench.mutants import check_catalogue


def test_every_mutant_matches_its_file_exactly_once() -> None:
    assert check_catalogue() == []
