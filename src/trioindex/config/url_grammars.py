"""The grammar and redaction of the URL keys, owned by the modules that read those URLs:
``database.url`` is libpq's (:mod:`trioindex.db.pool`), ``storage.url`` the object store's
(:mod:`trioindex.storage.urls`). Each is imported when a value is checked or shown, so that
reading the configuration loads neither psycopg nor Trio."""

from __future__ import annotations


def database_url_problem(url: str) -> str | None:
    """What is wrong with a ``database.url`` value, or None."""
    from trioindex.db.pool import database_url_problem as problem

    return problem(url)


def storage_url_problem(url: str) -> str | None:
    """What is wrong with a ``storage.url`` value, or None."""
    from trioindex.storage.urls import storage_url_problem as problem

    return problem(url)


def redact_database_url(url: str) -> str:
    """A ``database.url`` value with its password hidden."""
    from trioindex.db.pool import redact_conninfo

    return redact_conninfo(url)
