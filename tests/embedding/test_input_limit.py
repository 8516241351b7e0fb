"""Inputs over an embedding server's input limit: the fake server enforces TEI's 413 with the real
MiniLM tokenizer, and the clients answer by smaller requests and pieces, never by failing the
document for good; an input that cannot be cut fails with one line naming the limit."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import trio

from testkit.embed_server import BODY_MARKER, FakeEmbedServer, fake_vector
from tests.cjk_texts import KOREAN_PARAGRAPHS, document, minilm_tokenizer, real_count
from tests.embedding.http_clients import DIM, HTTP_APIS, open_http, openai_through, served
from trioindex.embedding.fitting import MAX_PIECES, mean_vector
from trioindex.embedding.transport import InputTooLong, parse_json
from trioindex.embedding.vectors import validate_vectors
from trioindex.errors import FailureType, ProviderRejectedInput

LIMIT = 512
SECRET = "chunk-text-5d2a-do-not-leak"


@pytest.fixture
def server() -> Iterator[FakeEmbedServer]:
    with FakeEmbedServer(
        dimension=DIM, max_input_length=LIMIT, tokenizer=minilm_tokenizer(), shuffle=False
    ) as fake:
        yield fake


class Recording(httpx.AsyncBaseTransport):
    """The real HTTP transport, keeping each embedding request's inputs and answer status."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.sent: list[tuple[int, list[str]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST":
            body = json.loads(request.content)
            inputs = body.get("inputs", body.get("input"))
            self.sent.append((response.status_code, list(inputs)))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_a_chunk_over_the_limit_is_embedded_in_pieces(
    server: FakeEmbedServer, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Korean chunk of 1,500 characters (~2,000 MiniLM tokens) among short ones, against a
    server enforcing 512 tokens with 413 (on TEI's /embed and OpenAI-compatible routes): it
    failed the whole call with EMBEDDING_RESULT_INVALID, for good."""
    counter = minilm_tokenizer()
    long = document(KOREAN_PARAGRAPHS, 1_500)[:1_500]
    assert real_count(counter, long) > 3 * LIMIT
    items = [f"short text {i}" for i in range(7)]
    items.insert(5, long)
    caplog.set_level(logging.WARNING)
    recording = Recording()
    with trio.fail_after(30):
        embedder = await open_http(
            server, api, batch_size=8, request_timeout=10, transport=recording
        )
        try:
            vectors = (await embedder.embed(items)).matrix()
        finally:
            await embedder.aclose()
    assert len(vectors) == len(items)
    for text, vector in zip(items, vectors, strict=True):
        if text is not long:
            assert np.allclose(vector, served(text, api))
    # the long chunk's vector: the pieces the server accepted, weighted by their characters
    refused = [inputs for status, inputs in recording.sent if status == 413]
    last_refusal = max(n for n, (status, _) in enumerate(recording.sent) if status == 413)
    pieces = [  # those of the last cut (a piece refused cuts the text again, finer)
        text
        for status, inputs in recording.sent[last_refusal + 1 :]
        for text in inputs
        if text not in items
    ]
    assert "".join(pieces) == long
    assert all(real_count(counter, piece) <= LIMIT for piece in pieces)
    served_pieces = validate_vectors(
        [served(p, api) for p in pieces], expected_count=len(pieces), dimension=DIM
    )
    expected = mean_vector(served_pieces, [len(p) for p in pieces]).matrix()[0]
    assert np.allclose(vectors[5], expected, atol=1e-6)
    assert np.isclose(np.linalg.norm(vectors[5]), 1.0)
    # found by halving the refused request, then cut by the server's stated count
    assert refused[0] == items
    assert len(recording.sent) == 8  # 1 + 2 x log2(8) + 1 for the pieces (6 of them)
    assert server.stats().too_long == len(refused)
    assert "1 of 8 texts were longer than the embedding server's input limit" in caplog.text
    assert "(512 tokens)" in caplog.text


async def test_the_coalesced_worker_path_splits_too(server: FakeEmbedServer) -> None:
    """The worker sends through the coalescer, which calls the embedder: the same answer."""
    from trioindex.embedding.batching import EmbeddingCoalescer

    long = document(KOREAN_PARAGRAPHS, 3_000)[:3_000]
    with trio.fail_after(30):
        embedder = await open_http(server, "tei", batch_size=8, request_timeout=10)
        try:
            coalescer = EmbeddingCoalescer(embedder.embed, max_batch_size=8, max_in_flight=2)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(coalescer.serve)
                matrix = await coalescer.embed([long, "a short one"], DIM)
                nursery.cancel_scope.cancel()
        finally:
            await embedder.aclose()
    assert matrix.shape == (2, DIM)
    assert np.allclose(matrix[1], fake_vector("a short one", DIM), atol=1e-6)
    assert np.isclose(np.linalg.norm(matrix[0]), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("text", "how"),
    [("힝", "and it cannot be cut"), ("힝힝힝", "even cut into 3 pieces")],
)
async def test_an_input_that_cannot_be_cut_fails_in_one_line_naming_the_limit(
    server: FakeEmbedServer, text: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    # One syllable is 3 MiniLM tokens and 2 special ones: over a limit of 4, however cut.
    server.configure(max_input_length=4)
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(30):
        embedder = await open_http(server, "tei", batch_size=8, request_timeout=10)
        try:
            with pytest.raises(ProviderRejectedInput) as caught:
                await embedder.embed(["fits", text])
        finally:
            await embedder.aclose()
    exc = caught.value
    assert type(exc) is ProviderRejectedInput
    assert exc.failure_type is FailureType.EMBEDDING_RESULT_INVALID and not exc.retryable
    assert exc.message == (
        f"embedding server refuses an input of {len(text)} characters as too long, {how} "
        "(HTTP 413; input limit 4 tokens)"
    )
    assert "\n" not in exc.message
    for seen in (exc.message, caplog.text):
        assert BODY_MARKER not in seen
        assert text not in seen
    assert server.stats().embed_requests <= 8


async def test_a_server_that_refuses_everything_ends_after_bounded_requests(
    server: FakeEmbedServer,
) -> None:
    # A 413 for every request (a proxy's body limit, say): smaller requests, then pieces, then
    # a final refusal; never a loop.
    server.set_mode("status_413")
    with trio.fail_after(30):
        embedder = await open_http(server, "tei", batch_size=8, request_timeout=10)
        try:
            with pytest.raises(ProviderRejectedInput, match="as too long, even cut into"):
                await embedder.embed([f"{SECRET} {i}" for i in range(8)])
        finally:
            await embedder.aclose()
    assert server.stats().embed_requests <= 4 * MAX_PIECES


def _vllm(limit: int) -> httpx.MockTransport:
    """An OpenAI-compatible server (vLLM's wording) refusing inputs over ``limit`` characters
    with HTTP 400."""

    def handler(request: httpx.Request) -> httpx.Response:
        inputs = json.loads(request.content)["input"]
        for text in inputs:
            if len(text) > limit:
                message = (
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {len(text)} tokens in the input for embedding generation. "
                    f"Please reduce the length of the input. {BODY_MARKER}"
                )
                return httpx.Response(
                    400, json={"object": "error", "message": message, "type": "BadRequestError"}
                )
        data = [{"index": i, "embedding": fake_vector(t, DIM)} for i, t in enumerate(inputs)]
        return httpx.Response(200, json={"object": "list", "data": data})

    return httpx.MockTransport(handler)


async def test_an_openai_compatible_400_stating_the_limit_is_split_too() -> None:
    text = "word " * 300
    with trio.fail_after(10):
        embedder = await openai_through(_vllm(400))
        try:
            [vector] = (await embedder.embed([text])).matrix()
        finally:
            await embedder.aclose()
    assert np.isclose(np.linalg.norm(vector), 1.0)


@pytest.mark.parametrize(
    ("status", "body", "limit", "given"),
    [
        (
            413,
            {
                "error": "Input validation error: `inputs` must have less than 512 tokens. "
                "Given: 2358",
                "error_type": "Validation",
            },
            512,
            2358,
        ),
        (
            413,
            {
                "message": "Input validation error: `inputs` must have less than 8192 tokens. "
                "Given: 9718",
                "code": 413,
                "type": "Validation",
            },
            8192,
            9718,
        ),
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens, however you "
                    "requested 10000 tokens (10000 in your prompt; 0 for the completion).",
                    "type": "invalid_request_error",
                }
            },
            8192,
            10000,
        ),
        (413, "<html>413 Request Entity Too Large</html>", None, None),
    ],
)
def test_refusals_as_too_long_are_classified_with_the_stated_figures(
    status: int, body: object, limit: int | None, given: int | None
) -> None:
    if isinstance(body, str):
        response = httpx.Response(status, text=f"{body} {SECRET}")
    else:
        response = httpx.Response(status, json=body)
    with pytest.raises(InputTooLong) as caught:
        parse_json(response)
    exc = caught.value
    assert (exc.status, exc.limit, exc.given) == (status, limit, given)
    assert f"HTTP {status}" in exc.message
    assert SECRET not in exc.message and "validation error" not in exc.message.lower()
    if limit is not None:
        assert f"limit {limit} tokens, given {given}" in exc.message


def test_a_400_or_422_without_a_stated_limit_is_a_plain_refusal() -> None:
    for status in (400, 422):
        response = httpx.Response(status, json={"error": "bad input", "error_type": "Tokenizer"})
        with pytest.raises(ProviderRejectedInput) as caught:
            parse_json(response)
        assert type(caught.value) is ProviderRejectedInput
