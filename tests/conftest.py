"""Shared fixtures are plugins under tests/fixtures/; what they start is in testkit/."""

pytest_plugins = [
    "tests.fixtures.embed",
    "tests.fixtures.s3",
    "tests.fixtures.database",
]
