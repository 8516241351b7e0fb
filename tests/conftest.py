"""Shared fixtures are plugins under tests/fixtures/ (and the fake embedding server)."""

pytest_plugins = [
    "tests.fixtures.database",
]
