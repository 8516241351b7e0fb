"""HTTP transport shared by the TEI and OpenAI-compatible providers, and its error translation.

Owns the ``httpx.AsyncClient`` (connection pool, bearer key, per-request deadline) and turns every
way a request can go wrong into the error hierarchy at this boundary:

- connection errors, timeouts, 429, 424, 5xx (and other unexpected statuses)
  → :class:`~trioindex.errors.ProviderUnavailable` (retryable)
- 400 / 413 / 422, the server refusing the input itself → :class:`ProviderRejectedInput`; of
  those, 413 and any refusal whose message states a token limit → :class:`InputTooLong`, which
  the batching answers by sending smaller requests (:mod:`trioindex.embedding.fitting`)
- a body that is not JSON → :class:`~trioindex.errors.ResultInvalid`

Messages carry the status code and at most a short classified reason (a TEI ``error_type`` or an
OpenAI ``error.type`` when it is a plain identifier) and the two numbers of a stated token limit,
never the body, the input, the URL's credentials or the key. The token limit is read from TEI's
``Input validation error: `inputs` must have less than 512 tokens. Given: 2358`` (HTTP 413,
also on its OpenAI-compatible route) and the OpenAI / vLLM ``maximum context length is 512
tokens. However, you requested 2358 tokens`` (HTTP 400).
"""

from __future__ import annotations

import json
import logging
import re

import attrs
import httpx
import orjson
import trio

from trioindex.errors import (
    ProviderRejectedInput,
    ProviderUnavailable,
    ResultInvalid,
    StepFailure,
)

logger = logging.getLogger(__name__)

_REASON = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,39}")
# The stated token limit and the input's count, in the error messages the module docstring names.
_TOKEN_LIMIT = (
    re.compile(r"must have less than (\d{1,9}) tokens\. Given: (\d{1,9})"),
    re.compile(
        r"maximum context length is (\d{1,9}) tokens.{0,40}?requested (\d{1,9}) tokens",
        re.IGNORECASE | re.DOTALL,
    ),
)


class InputTooLong(ProviderRejectedInput):
    """The server refused a request as too large: an input over the model's input length (or a
    batch over the server's limit). ``status`` is the HTTP status; ``limit`` / ``given`` are the
    token limit and the refused input's count when the server stated them."""

    def __init__(
        self, message: str, *, status: int, limit: int | None = None, given: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.limit = limit
        self.given = given


@attrs.define(eq=False)
class HttpTransport:
    """One pooled HTTP client to one embedding server."""

    _client: httpx.AsyncClient
    request_timeout: float
    display_url: str

    @classmethod
    def open(
        cls,
        *,
        url: str,
        request_timeout: float,
        max_connections: int,
        api_key: str | None,
        transport: httpx.AsyncBaseTransport | None,
    ) -> HttpTransport:
        # The key lives only in the client's default headers: never in a value with a repr, a log
        # line or a message.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Credentials in the URL become basic auth (unless a key is configured) and leave the
        # URL, which httpx writes into its own log lines.
        parsed = httpx.URL(url)
        auth = None
        if parsed.userinfo:
            if not api_key:
                auth = httpx.BasicAuth(parsed.username, parsed.password)
            parsed = parsed.copy_with(userinfo=b"")
        client = httpx.AsyncClient(
            base_url=parsed,
            headers=headers,
            auth=auth,
            # httpx's timeouts are per socket operation; the trio deadline in send() bounds the
            # whole request. One spare connection for the /info probe.
            timeout=httpx.Timeout(request_timeout),
            limits=httpx.Limits(
                max_connections=max_connections + 1,
                max_keepalive_connections=max_connections + 1,
            ),
            transport=transport,
            follow_redirects=False,
        )
        return cls(client, request_timeout, safe_url(url))

    @property
    def base_path(self) -> str:
        """The path part of the configured URL ("/" when it has none)."""
        return self._client.base_url.path

    async def post_json(self, path: str, payload: object) -> object:
        """``POST path`` with a JSON body; the parsed JSON answer, or a classified failure."""
        body, _text = await self.post_json_with_text(path, payload)
        return body

    async def post_json_with_text(self, path: str, payload: object) -> tuple[object, bytes]:
        """:meth:`post_json`'s answer, and the bytes it was parsed from."""
        response = await self.send("POST", path, payload)
        try:
            return parse_json(response), response.content
        finally:
            release_body(response)

    async def send(self, method: str, path: str, payload: object = None) -> httpx.Response:
        """One request under the per-request deadline; any status is returned as is.

        Raises :class:`ProviderUnavailable` when no answer arrives (connection error, timeout),
        :class:`ResultInvalid` when its body cannot be decoded.
        """
        response: httpx.Response | None = None
        with trio.move_on_after(self.request_timeout):
            try:
                response = await self._client.request(method, path, json=payload)
            except httpx.TimeoutException as exc:
                raise ProviderUnavailable(
                    f"embedding request timed out ({type(exc).__name__})"
                ) from exc
            except httpx.TransportError as exc:
                raise ProviderUnavailable(
                    f"cannot reach the embedding server ({type(exc).__name__})"
                ) from exc
            except httpx.DecodingError:
                raise ResultInvalid("embedding response body could not be decoded") from None
            except httpx.RequestError as exc:
                raise ProviderUnavailable(
                    f"embedding request failed ({type(exc).__name__})"
                ) from exc
        if response is None:
            raise ProviderUnavailable(
                f"embedding request timed out after {self.request_timeout:g}s"
            )
        return response

    async def aclose(self) -> None:
        await self._client.aclose()


def parse_json(response: httpx.Response) -> object:
    """The JSON body of a 2xx answer, or the classified failure for any other answer."""
    if not response.is_success:
        raise failure_for(response)
    try:
        # orjson parses a 32 x 1024 float answer several times faster than the stdlib, on the
        # event loop thread; it refuses the NaN/Infinity literals some servers emit, so those
        # rare bodies go through the stdlib parser and on to vector validation.
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(response.content)
    except ValueError:
        # from None: a JSONDecodeError holds the whole body in .doc.
        raise ResultInvalid(
            f"embedding response is not valid JSON (HTTP {response.status_code})"
        ) from None


def release_body(response: httpx.Response) -> None:
    """Let ``response`` and its body be freed as soon as the caller drops it.

    httpx binds a response's stream to the response (``BoundAsyncStream``), a reference cycle:
    without this, every answer (~650 KiB for 32 vectors of 1024 floats) waits for the cyclic
    garbage collector, and while a large document is embedded hundreds of them pile up in the
    oldest generation. The body has been read; an empty stream replaces the bound one."""
    response.stream = httpx.ByteStream(b"")


def failure_for(response: httpx.Response) -> StepFailure:
    """The classified failure for a non-2xx answer (module docstring)."""
    body = _error_body(response)
    status = response.status_code
    reason = _reason(body)
    limit = _token_limit(body) if 400 <= status < 500 else None
    if status == 413 or limit is not None:
        suffix = f", {reason}" if reason else ""
        stated = f", limit {limit[0]} tokens, given {limit[1]}" if limit else ""
        return InputTooLong(
            f"embedding server rejected the request as too large (HTTP {status}{suffix}{stated})"
            ": a chunk may exceed the model's input length or the batch the server's limit",
            status=status,
            limit=limit[0] if limit else None,
            given=limit[1] if limit else None,
        )
    return _status_failure(status, reason)


def _status_failure(status: int, reason: str | None = None) -> StepFailure:
    """The classified failure for a non-2xx answer that is not :class:`InputTooLong`;
    ``reason`` must already be safe."""
    suffix = f", {reason}" if reason else ""
    if status == 422:
        return ProviderRejectedInput(
            f"embedding server could not process the input (HTTP 422{suffix}): a chunk may "
            "exceed the model's input length"
        )
    if status == 400:
        return ProviderRejectedInput(f"embedding server rejected the request (HTTP 400{suffix})")
    if status == 429:
        return ProviderUnavailable(f"embedding server is overloaded (HTTP 429{suffix})")
    if status == 424:
        return ProviderUnavailable(f"embedding server's model backend failed (HTTP 424{suffix})")
    if status == 503:
        return ProviderUnavailable(f"embedding server is unavailable (HTTP 503{suffix})")
    if status >= 500:
        return ProviderUnavailable(f"embedding server error (HTTP {status}{suffix})")
    if status in (401, 403):
        return ProviderUnavailable(
            f"embedding server refused the credentials (HTTP {status}{suffix}); "
            "check embedding.api-key"
        )
    if status == 404:
        return ProviderUnavailable(
            f"embedding endpoint not found (HTTP 404{suffix}); "
            "check embedding.url and embedding.api"
        )
    # Anything else (408, 3xx, ...) is treated as the server not being usable right now.
    return ProviderUnavailable(f"unexpected answer from the embedding server (HTTP {status})")


def _error_body(response: httpx.Response) -> dict[str, object]:
    """The JSON object of an error answer (``{}`` when it is not one)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _reason(body: dict[str, object]) -> str | None:
    """A short error class from a TEI or OpenAI error body, if it is a plain identifier."""
    candidate = body.get("error_type")  # TEI: {"error": ..., "error_type": "Validation"}
    error = body.get("error")
    if candidate is None and isinstance(error, dict):
        candidate = error.get("type")  # OpenAI: {"error": {"type": "invalid_request_error"}}
    if candidate is None:
        candidate = body.get("type")  # TEI's OpenAI route, vLLM: {"message", "type", "code"}
    if isinstance(candidate, str) and _REASON.fullmatch(candidate):
        return candidate
    return None


def _token_limit(body: dict[str, object]) -> tuple[int, int] | None:
    """``(limit, given)`` when the error message states a token limit (module docstring)."""
    error = body.get("error")
    messages = [error, body.get("message")]
    if isinstance(error, dict):
        messages.append(error.get("message"))
    for message in messages:
        if not isinstance(message, str):
            continue
        for pattern in _TOKEN_LIMIT:
            found = pattern.search(message[:2000])
            if found is not None:
                return int(found.group(1)), int(found.group(2))
    return None


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment: fit for a log line."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
