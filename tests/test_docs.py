"""The README says what the code does: its configuration table is the one the code renders."""

from __future__ import annotations

from pathlib import Path

from trioindex.config import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_configuration_reference_is_generated_from_the_settings_code() -> None:
    readme = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = readme.index("<!-- config-reference:end -->")
    assert readme[start:end].strip() == reference_markdown().strip(), (
        "README is out of date: paste `python -m trioindex.config` between the markers"
    )


def test_readme_opens_with_the_two_commands() -> None:
    opening = ROOT.joinpath("README.md").read_text(encoding="utf-8").splitlines()[:30]
    assert any(line.startswith("just worker") for line in opening)
    assert any(line.startswith("just test") for line in opening)


def test_every_metric_the_readme_names_exists() -> None:
    import re

    from trioindex.worker import metrics

    readme = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    names = {m.name for m in metrics.REGISTRY.collect()}
    mentioned = set(re.findall(r"`(trioindex_[a-z_]+)", readme))
    assert len(mentioned) >= 9
    for name in mentioned:
        assert name.removesuffix("_total") in names, name
