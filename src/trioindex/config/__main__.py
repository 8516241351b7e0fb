"""``python -m trioindex.config`` prints the reference table to paste into the docs."""

from trioindex.config.reference import reference_markdown

print(reference_markdown(), end="")
