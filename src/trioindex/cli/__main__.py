"""``python -m trioindex.cli``."""

from trioindex.cli import main

main()
