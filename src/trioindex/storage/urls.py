"""The ``storage.url`` grammar, and how any URL is shown without its credentials.

One parser for every caller: configuration loading reports a bad ``storage.url`` through
:func:`storage_url_problem`, and :func:`~trioindex.storage.open_store` builds its store from
:func:`parse_storage_url`, so a URL the configuration accepts is one a store opens on. The forms::

    file:///abs/path  file://localhost/abs/path       a folder (percent-decoded)
    file://.trioindex/blobs  file://./blobs           a folder relative to the working directory
                                                      (the host part starts with ".")
    s3://[KEY:SECRET@]host[:port]/bucket[?secure=false][&region=R]

``secure`` defaults to true and is ``true`` or ``false`` (``1`` / ``0`` also read as such). Key
and secret are percent-decoded and are given together or not at all (anonymous access).

A problem is phrased as the rule the URL breaks, never with the URL in it: the caller adds the
value through :func:`redact_url`, the one redaction for database, storage and embedding URLs.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Final

import attrs

_SCHEMES: Final = "must be a s3:// or file:// URL"
_FOLDER: Final = "must be file:///absolute/path"
_S3_QUERY: Final = frozenset({"secure", "region"})
_SECURE: Final[dict[str, bool]] = {"true": True, "1": True, "false": False, "0": False}


class StorageUrlError(ValueError):
    """A ``storage.url`` breaks the grammar; the message is the rule, never the URL."""


@attrs.frozen
class FolderLocation:
    """A ``file://`` URL: ``root`` is absolute, or relative to the working directory."""

    root: Path


@attrs.frozen
class S3Location:
    """An ``s3://`` URL, decoded; ``endpoint`` is ``host[:port]`` as the minio client wants it."""

    endpoint: str
    bucket: str
    access_key: str | None = attrs.field(repr=False)
    secret_key: str | None = attrs.field(repr=False)
    secure: bool
    region: str | None


def storage_url_problem(url: str) -> str | None:
    """The rule ``url`` breaks as a ``storage.url``, or None if it is one."""
    try:
        parse_storage_url(url)
    except StorageUrlError as exc:
        return str(exc)
    return None


def parse_storage_url(url: str) -> FolderLocation | S3Location:
    """``url`` decoded; :class:`StorageUrlError` naming the broken rule if it is not one."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise StorageUrlError(f"{_SCHEMES} (not a valid URL)") from None
    if parts.scheme == "file":
        return _folder(parts)
    if parts.scheme == "s3":
        return _s3(parts, port)
    raise StorageUrlError(f"{_SCHEMES} (unknown scheme)")


def _folder(parts: urllib.parse.SplitResult) -> FolderLocation:
    if parts.query or parts.fragment:
        raise StorageUrlError(f"{_FOLDER} (a file:// URL takes no query or fragment)")
    path = urllib.parse.unquote(parts.path)
    if parts.netloc in ("", "localhost"):
        if not path.startswith("/"):
            raise StorageUrlError(f"{_FOLDER} (an absolute path after file://)")
        return FolderLocation(Path(path))
    if parts.netloc.startswith("."):
        return FolderLocation(Path(urllib.parse.unquote(parts.netloc) + path))
    raise StorageUrlError(f"{_FOLDER} (a file:// URL cannot name a remote host)")


def _s3(parts: urllib.parse.SplitResult, port: int | None) -> S3Location:
    if not parts.hostname:
        raise StorageUrlError("must name a host")
    bucket = parts.path.strip("/")
    if not bucket or "/" in bucket:
        raise StorageUrlError("must name one bucket as its path (s3://host/bucket)")
    if parts.fragment:
        raise StorageUrlError("must not have a #fragment")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - _S3_QUERY
    if unknown:
        raise StorageUrlError(
            f"must not have unknown query parameter(s) {', '.join(sorted(unknown))}"
        )
    secure = _SECURE.get(query.get("secure", ["true"])[-1])
    if secure is None:
        raise StorageUrlError("secure= must be true or false")
    region = query["region"][-1] if "region" in query else None
    access_key = urllib.parse.unquote(parts.username) if parts.username is not None else None
    secret_key = urllib.parse.unquote(parts.password) if parts.password is not None else None
    if (access_key is None) != (secret_key is None) or access_key == "" or secret_key == "":
        raise StorageUrlError(
            "must give both the access key and the secret (KEY:SECRET@), or neither"
        )
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return S3Location(
        endpoint=f"{host}:{port}" if port is not None else host,
        bucket=bucket,
        access_key=access_key,
        secret_key=secret_key,
        secure=secure,
        region=region or None,
    )


# --- redaction --------------------------------------------------------------------------

_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>.*)@", re.DOTALL)
_SECRET_PARAM = re.compile(r"pass|secret|key|token|credential", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its credentials and secret-looking query values replaced by ``***``.

    ``user:password@`` keeps the user (``s3://KEY:***@host/bucket``); a lone ``token@`` is hidden
    whole, and so is the value of a query parameter named like a secret (``password=***``).
    Works on malformed URLs too and errs towards hiding more: the user-info runs to the last
    ``@``, so a secret holding an unescaped ``@`` or ``/`` is still masked. A URL whose
    credentials cannot be located becomes ``<redacted URL>``. Safe for logs and messages.
    """
    match = _USERINFO.match(url)
    if match is not None:
        user, colon, _ = match["userinfo"].partition(":")
        head = f"{match['head']}{user}:***@" if colon else f"{match['head']}***@"
        rest = url[match.end() :]
    elif "@" in url:
        # "u:pw@host" without "//" parses as scheme "u" and path "pw@host": hide it all.
        return "<redacted URL>"
    else:
        head, rest = "", url
    before_fragment, hash_sign, fragment = rest.partition("#")
    base, question_mark, query = before_fragment.partition("?")
    if not question_mark:
        return head + rest
    pairs = "&".join(_redact_parameter(pair) for pair in query.split("&"))
    return f"{head}{base}?{pairs}{hash_sign}{fragment}"


def _redact_parameter(pair: str) -> str:
    name, equals, _ = pair.partition("=")
    if equals and _SECRET_PARAM.search(urllib.parse.unquote_plus(name)):
        return f"{name}=***"
    return pair
