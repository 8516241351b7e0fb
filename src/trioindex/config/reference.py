"""The reference table of every key, generated from the registry.

README.md and docs/design/configuration.md carry its output between markers; a test fails when
they and the code differ. ``python -m trioindex.config`` prints it.
"""

from __future__ import annotations

from trioindex.config.key_spec import Derived
from trioindex.config.keys import KEYS


def reference_markdown() -> str:
    """The table of every key, for README and docs (a test keeps the docs in step with it)."""
    rows = [
        "| Key | Environment variable | Type | Default | Rule | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for spec in KEYS:
        if isinstance(spec.default, Derived):
            default = spec.default.text
        elif spec.default is None:
            default = "(none)"
        else:
            default = f"`{spec.default}`"
        cells = (f"`{spec.key}`", f"`{spec.env}`", spec.kind.value, default, spec.rule, spec.doc)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"
