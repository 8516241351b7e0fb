"""Shared fixtures are plugins under tests/fixtures/ (and the fake embedding server)."""

pytest_plugins = [
    "tests.fakes.embed_server",
    "tests.fixtures.s3",
    "tests.fixtures.database",
]
