"""The HTTP embedding clients (TEI and OpenAI-compatible) against the real fake server on
127.0.0.1: ordering, batching, the in-flight cap, cancellation, error classification and
secrecy; plus the vector checks and hash, and batch planning."""

from __future__ import annotations

import base64
import gc
import hashlib
import json
import logging
import math
import struct
import weakref
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from testkit.embed_server import BODY_MARKER, FakeEmbedServer, fake_vector
from tests.embedding.http_clients import DIM, HTTP_APIS, open_http, openai_through, served
from trioindex.embedding import (
    Embedder,
    estimate_tokens,
    open_embedder,
    plan_batches,
    validate_vectors,
    vector_sha256,
)
from trioindex.embedding.tei import same_model
from trioindex.embedding.transport import HttpTransport
from trioindex.errors import (
    ConfigError,
    ProviderRejectedInput,
    ProviderUnavailable,
    ResultInvalid,
    StepFailure,
)

SECRET_TEXT = "chunk-text-7c1e-do-not-leak"
API_KEY = "sk-test-4b9f0d2e-do-not-leak"


@pytest.fixture
def server() -> Iterator[FakeEmbedServer]:
    with FakeEmbedServer(dimension=DIM) as fake:
        yield fake


def texts(n: int, prefix: str = "text") -> list[str]:
    return [f"{prefix} {i}" for i in range(n)]


# -- vectors ------------------------------------------------------------------------------


def test_vector_sha256_hashes_big_endian_binary32() -> None:
    # The bytes Java's ByteBuffer.putFloat writes for 1.0, -2.0, 0.5.
    expected_bytes = bytes.fromhex("3f800000c00000003f000000")
    assert struct.pack(">3f", 1.0, -2.0, 0.5) == expected_bytes
    assert vector_sha256([1.0, -2.0, 0.5]) == hashlib.sha256(expected_bytes).hexdigest()
    assert vector_sha256([1.0]) == (
        "de620abd6d3615746360c1d15ce3a56291236d37424124054a49d25e947ffc4d"
    )
    # Rounded to binary32 first: a float64 that rounds to the same float32 hashes the same.
    assert vector_sha256([0.1]) == vector_sha256([float(np.float32(0.1))])


def test_validate_vectors_returns_fresh_float_lists() -> None:
    raw: list[object] = [[1, 0.5], [-0.0, 2]]
    checked = validate_vectors(raw, expected_count=2, dimension=2).tolist()
    assert checked == [[1.0, 0.5], [-0.0, 2.0]]
    assert all(type(x) is float for v in checked for x in v)
    assert checked[0] is not raw[0]


@pytest.mark.parametrize(
    ("vectors", "fragment"),
    [
        ({"data": []}, "not a list"),
        ([[0.0, 1.0]], "1 vectors for 2 inputs"),
        ([[0.0, 1.0], None], "vector 1 is null"),
        ([[0.0, 1.0], "0.0,1.0"], "not a list"),
        ([[0.0, 1.0], [0.0]], "dimension 1, expected 2"),
        ([[0.0, 1.0], [0.0, 1.0, 2.0]], "dimension 3, expected 2"),
        ([[0.0, "1.0"], [0.0, 1.0]], "non-number"),
        ([[0.0, True], [0.0, 1.0]], "non-number"),
        ([[0.0, None], [0.0, 1.0]], "non-number"),
        ([[0.0, math.nan], [0.0, 1.0]], "NaN or Infinity"),
        ([[0.0, 1.0], [math.inf, 1.0]], "NaN or Infinity"),
        ([[0.0, 1.0], [-math.inf, 1.0]], "NaN or Infinity"),
        ([[0.0, 1e39], [0.0, 1.0]], "beyond float32"),
    ],
)
def test_validate_vectors_rejects(vectors: object, fragment: str) -> None:
    with pytest.raises(ResultInvalid, match=fragment) as caught:
        validate_vectors(vectors, expected_count=2, dimension=2)
    assert not isinstance(caught.value, ProviderRejectedInput)


# -- batch planning -----------------------------------------------------------------------


def test_plan_batches_by_count_and_tokens() -> None:
    assert plan_batches(texts(10), max_batch_size=3) == [
        range(0, 3),
        range(3, 6),
        range(6, 9),
        range(9, 10),
    ]
    assert plan_batches(texts(3), max_batch_size=1) == [range(0, 1), range(1, 2), range(2, 3)]
    assert plan_batches([], max_batch_size=3) == []
    # 30 ASCII characters estimate to 12 tokens: two fit in 30, a 102-token text goes alone.
    thirty = "x" * 30
    assert estimate_tokens(thirty) == 12
    batch = [thirty, thirty, thirty, "y" * 300, thirty]
    assert plan_batches(batch, max_batch_size=32, max_batch_tokens=30) == [
        range(0, 2),
        range(2, 3),
        range(3, 4),
        range(4, 5),
    ]


def test_estimate_tokens_counts_hangul_per_character() -> None:
    # 10 Hangul syllables are 30 UTF-8 bytes: about one token each, not 10 // 3.
    assert estimate_tokens("가" * 10) == 12


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=200), max_size=60),
    max_batch_size=st.integers(min_value=1, max_value=8),
    max_batch_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=200)),
)
def test_plan_batches_covers_every_text_once_within_limits(
    lengths: list[int], max_batch_size: int, max_batch_tokens: int | None
) -> None:
    items = ["a" * n for n in lengths]
    batches = plan_batches(items, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens)
    assert [i for batch in batches for i in batch] == list(range(len(items)))
    for batch in batches:
        assert 1 <= len(batch) <= max_batch_size
        if max_batch_tokens is not None and len(batch) > 1:
            assert sum(estimate_tokens(items[i]) for i in batch) <= max_batch_tokens


# -- happy paths --------------------------------------------------------------------------


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_embed_returns_each_text_its_vector_in_order(
    server: FakeEmbedServer, api: str
) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, api, batch_size=4, max_in_flight=3)
        try:
            items = texts(11)
            vectors = (await embedder.embed(items)).tolist()
        finally:
            await embedder.aclose()
    assert vectors == [served(text, api) for text in items]
    stats = server.stats()
    assert sorted(stats.batch_sizes) == [3, 4, 4]
    assert stats.inputs == 11


async def test_openai_orders_shuffled_data_by_index(server: FakeEmbedServer) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, "openai", batch_size=8)
        try:
            items = texts(8)
            vectors = (await embedder.embed(items)).tolist()
            # The same request without shuffling shows the server really reorders.
            server.configure(shuffle=False)
            assert (await embedder.embed(items)).tolist() == vectors
        finally:
            await embedder.aclose()
    # asked as base64 of float32 (OpenAI's compact format): the server's vectors to float32
    assert vectors == [served(text, "openai") for text in items]
    payload = server.stats().last_payload
    assert payload is not None
    assert payload["model"] == "BAAI/bge-m3"
    assert payload["input"] == items
    assert payload["encoding_format"] == "base64"


async def test_openai_shuffled_answer_is_really_shuffled(server: FakeEmbedServer) -> None:
    # Guards the test above: the raw answer of the fake server is out of order.
    body = {"model": "m", "input": texts(8)}
    async with httpx.AsyncClient() as client:
        with trio.fail_after(10):
            response = await client.post(f"{server.url}/v1/embeddings", json=body)
    assert [item["index"] for item in response.json()["data"]] != list(range(8))


async def test_tei_asks_base64_on_the_openai_route_when_the_server_refuses_long_inputs(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    items = texts(6)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=8)
        try:
            vectors = (await embedder.embed(items)).tolist()
        finally:
            await embedder.aclose()
    assert vectors == [served(text, "tei") for text in items]
    # no model name: TEI serves one model and warns on every request naming another
    assert server.stats().last_payload == {"input": items, "encoding_format": "base64"}
    assert "vectors=base64" in caplog.text


@pytest.mark.parametrize(
    "info",
    [
        {"auto_truncate": True},  # the OpenAI route would cut a long input silently
        {"auto_truncate": None},  # not said: it might
        {"tei_version": "1.2.3"},  # before the base64 format
        {"tei_version": "0.9.0"},
        {"tei_version": "fake"},
        {"tei_version": ""},
        {"tei_version": 13},
        {"info_enabled": False},
    ],
    ids=repr,
)
async def test_tei_asks_embed_with_truncate_false_otherwise(
    server: FakeEmbedServer, info: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(**info)
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei")
        try:
            assert (await embedder.embed(["one"])).tolist() == [served("one", "tei")]
        finally:
            await embedder.aclose()
    assert server.stats().last_payload == {"inputs": ["one"], "truncate": False, "normalize": True}
    assert "vectors=json" in caplog.text


@pytest.mark.parametrize("version", ["1.3.0", "1.10.1", "2.0.0-rc1", "1.9.0-dev"])
async def test_tei_versions_with_the_base64_format(server: FakeEmbedServer, version: str) -> None:
    server.configure(tei_version=version)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei")
        try:
            await embedder.embed(["one"])
        finally:
            await embedder.aclose()
    payload = server.stats().last_payload
    assert payload is not None and payload.get("encoding_format") == "base64"


async def test_tei_without_the_openai_route_asks_embed_from_then_on(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(openai_route=False)  # a proxy passing /embed only: 404 on that route
    caplog.set_level(logging.WARNING)
    items = texts(8)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=2, max_in_flight=4)
        try:
            assert (await embedder.embed(items)).tolist() == [served(t, "tei") for t in items]
            assert (await embedder.embed(["last"])).tolist() == [served("last", "tei")]
        finally:
            await embedder.aclose()
    stats = server.stats()
    assert stats.batch_sizes == (2, 2, 2, 2, 1)  # every text embedded once, on /embed
    # /info, at most one refused request per batch in flight, then /embed only
    assert stats.requests - stats.info_requests - stats.embed_requests in range(1, 5)
    assert caplog.text.count("asking /embed from now on") == 1


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_empty_input_makes_no_request(server: FakeEmbedServer, api: str) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, api)
        try:
            assert (await embedder.embed([])).tolist() == []
        finally:
            await embedder.aclose()
    assert server.stats().embed_requests == 0


async def test_openai_url_ending_in_v1_is_not_doubled(server: FakeEmbedServer) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, "openai", url=f"{server.url}/v1")
        try:
            assert (await embedder.embed(["a"])).tolist() == [served("a", "openai")]
        finally:
            await embedder.aclose()


# -- batching against the server ----------------------------------------------------------


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_batches_by_count_and_batch_size_one_is_one_call_per_chunk(
    server: FakeEmbedServer, api: str
) -> None:
    items = texts(10)
    with trio.fail_after(10):
        embedder = await open_http(server, api, batch_size=3, max_in_flight=1)
        try:
            assert (await embedder.embed(items)).tolist() == [served(t, api) for t in items]
        finally:
            await embedder.aclose()
        assert server.stats().batch_sizes == (3, 3, 3, 1)
        server.reset_stats()
        embedder = await open_http(server, api, batch_size=1, max_in_flight=1)
        try:
            assert (await embedder.embed(items)).tolist() == [served(t, api) for t in items]
        finally:
            await embedder.aclose()
    assert server.stats().batch_sizes == (1,) * 10
    assert server.stats().embed_requests == 10


async def test_tei_batches_by_server_token_budget(server: FakeEmbedServer) -> None:
    server.configure(max_batch_tokens=30)
    thirty = "x" * 30  # 12 estimated tokens
    items = [thirty + str(i) for i in range(5)]  # 13 each: two per batch
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=32, max_in_flight=1)
        try:
            assert embedder.info.max_batch_tokens == 30
            assert (await embedder.embed(items)).tolist() == [served(t, "tei") for t in items]
        finally:
            await embedder.aclose()
    assert server.stats().batch_sizes == (2, 2, 1)


async def test_tei_clamps_batch_size_to_server_limit(server: FakeEmbedServer) -> None:
    server.configure(max_batch_size=3, max_input_length=512)
    items = texts(10)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=32, max_in_flight=1)
        try:
            assert embedder.info.max_batch_size == 3
            assert embedder.info.max_input_tokens == 512
            assert (await embedder.embed(items)).tolist() == [served(t, "tei") for t in items]
        finally:
            await embedder.aclose()
    assert server.stats().batch_sizes == (3, 3, 3, 1)


async def test_tei_without_info_uses_configured_limits(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(info_enabled=False)
    caplog.set_level(logging.WARNING)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=5, max_in_flight=1)
        try:
            assert embedder.info.max_batch_size == 5
            assert embedder.info.max_batch_tokens is None
            await embedder.embed(texts(7))
            await embedder.embed(texts(1))
        finally:
            await embedder.aclose()
    assert "no /info" in caplog.text
    stats = server.stats()
    assert stats.batch_sizes == (5, 2, 1)
    assert stats.info_requests == 1  # a 404 is an answer: not asked again


async def test_tei_asks_info_again_after_server_was_down_at_start(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(max_batch_size=3)
    server.set_mode("status", status=503)
    caplog.set_level(logging.WARNING)
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", batch_size=8, max_in_flight=1)
        try:
            assert embedder.info.max_batch_size == 8
            assert "asking again" in caplog.text
            server.set_mode("normal")
            items = texts(7)
            assert (await embedder.embed(items)).tolist() == [served(t, "tei") for t in items]
            assert embedder.info.max_batch_size == 3
        finally:
            await embedder.aclose()
    stats = server.stats()
    assert stats.info_requests == 2
    assert stats.batch_sizes == (3, 3, 1)  # no 413 from a batch of 8


async def test_tei_warns_on_a_different_model(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server.configure(model_id="intfloat/multilingual-e5-large")
    with trio.fail_after(10):
        embedder = await open_http(server, "tei")
        await embedder.aclose()
    assert "multilingual-e5-large" in caplog.text
    caplog.clear()
    server.configure(model_id="/data/BGE-M3")
    with trio.fail_after(10):
        embedder = await open_http(server, "tei")
        await embedder.aclose()
    assert "serves model" not in caplog.text


def test_same_model() -> None:
    assert same_model("BAAI/bge-m3", "BAAI/bge-m3")
    assert same_model("BAAI/bge-m3", "/models/bge-m3/")
    assert same_model("BAAI/bge-m3", "baai/BGE-M3")
    assert not same_model("BAAI/bge-m3", "BAAI/bge-large-en-v1.5")


# -- concurrency and cancellation ---------------------------------------------------------


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_requests_in_flight_are_capped_across_callers(
    server: FakeEmbedServer, api: str
) -> None:
    server.configure(latency=0.03)
    with trio.fail_after(20):
        embedder = await open_http(server, api, batch_size=1, max_in_flight=2)
        results: dict[str, list[list[float]]] = {}

        async def job(name: str) -> None:
            results[name] = (await embedder.embed(texts(6, name))).tolist()

        try:
            async with trio.open_nursery() as nursery:
                for name in ("a", "b", "c"):
                    nursery.start_soon(job, name)
        finally:
            await embedder.aclose()
    for name in ("a", "b", "c"):
        assert results[name] == [served(t, api) for t in texts(6, name)]
    stats = server.stats()
    assert stats.embed_requests == 18
    assert stats.max_concurrent == 2


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_cancelling_a_hanging_request_is_prompt(server: FakeEmbedServer, api: str) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, api, request_timeout=60.0)
        try:
            server.set_mode("hang")
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(embedder.embed, texts(8))
                    # cancel once both batches hang in the server, however loaded the machine
                    # (the server runs in its own thread: there is no trio.Event to wait on)
                    while server.stats().embed_requests < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    cancelled_at = trio.current_time()
                    scope.cancel()
            elapsed = trio.current_time() - cancelled_at
        finally:
            await embedder.aclose()
    assert scope.cancelled_caught
    assert elapsed < 1.0
    assert server.stats().embed_requests == 2  # both batches were in flight


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_request_timeout_is_provider_unavailable(server: FakeEmbedServer, api: str) -> None:
    with trio.fail_after(10):
        embedder = await open_http(server, api, request_timeout=0.3)
        try:
            server.set_mode("hang")
            started = trio.current_time()
            with pytest.raises(ProviderUnavailable, match="timed out"):
                await embedder.embed(texts(2))
            elapsed = trio.current_time() - started
        finally:
            await embedder.aclose()
    assert elapsed < 2.0


# -- error classification -----------------------------------------------------------------

FAULTS: list[tuple[str, type[StepFailure]]] = [
    ("status_500", ProviderUnavailable),
    ("status_502", ProviderUnavailable),
    ("status_503", ProviderUnavailable),
    ("status_429", ProviderUnavailable),
    ("status_424", ProviderUnavailable),
    ("disconnect", ProviderUnavailable),
    ("status_413", ProviderRejectedInput),
    ("status_422", ProviderRejectedInput),
    ("status_400", ProviderRejectedInput),
    ("malformed", ResultInvalid),
    ("null_vector", ResultInvalid),
    ("wrong_count", ResultInvalid),
    ("wrong_dimension", ResultInvalid),
    ("nan", ResultInvalid),
    ("infinity", ResultInvalid),
]


@pytest.mark.parametrize("api", HTTP_APIS)
@pytest.mark.parametrize(("mode", "error"), FAULTS, ids=[mode for mode, _ in FAULTS])
async def test_fault_maps_to_its_error_and_returns_nothing(
    server: FakeEmbedServer,
    api: str,
    mode: str,
    error: type[StepFailure],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    items = [f"{SECRET_TEXT} {i}" for i in range(8)]
    with trio.fail_after(10):
        embedder = await open_http(server, api, batch_size=4, api_key=API_KEY)
        try:
            server.set_mode(mode)
            with pytest.raises(StepFailure) as caught:
                await embedder.embed(items)
        finally:
            await embedder.aclose()
    exc = caught.value
    assert type(exc) is error
    assert exc.retryable is (error is ProviderUnavailable)
    assert server.stats().embed_requests >= 1
    for text in (exc.message, str(exc), caplog.text):
        assert SECRET_TEXT not in text
        assert BODY_MARKER not in text
        assert API_KEY not in text
    for value in fake_vector(items[0], DIM)[:3]:
        assert repr(value) not in exc.message
    if mode.startswith("status_"):
        assert f"HTTP {mode.removeprefix('status_')}" in exc.message


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_unreachable_server_is_provider_unavailable_but_start_succeeds(
    api: str, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeEmbedServer(dimension=DIM) as gone:
        pass  # started and stopped: nothing listens on its port any more
    caplog.set_level(logging.WARNING)
    with trio.fail_after(10):
        embedder = await open_http(gone, api)
        try:
            with pytest.raises(ProviderUnavailable, match="cannot reach"):
                await embedder.embed(["x"])
        finally:
            await embedder.aclose()
    if api == "tei":
        assert "cannot read the embedding server's /info" in caplog.text


def _openai_answer(data: object) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": data})

    return httpx.MockTransport(handler)


async def _openai_answering(data: object) -> Embedder:
    """An OpenAI-compatible embedder whose server answers every request with ``data``."""
    return await openai_through(_openai_answer(data))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (None, "no data list"),
        ([{"index": 0, "embedding": [0.0] * DIM}], "1 vectors for 2 inputs"),
        ([{"index": 0, "embedding": [0.0] * DIM}] * 2, "repeated"),
        ([{"index": 0, "embedding": [0.0] * DIM}, {"index": 2, "embedding": [0.0] * DIM}], "range"),
        ([{"index": 0, "embedding": [0.0] * DIM}, {"embedding": [0.0] * DIM}], "missing"),
        (
            [{"index": 0, "embedding": [0.0] * DIM}, {"index": "1", "embedding": [0.0] * DIM}],
            "index",
        ),
        ([{"index": 0, "embedding": [0.0] * DIM}, {"index": 1, "embedding": "AAAA"}], "whole"),
        ([{"index": 0, "embedding": [0.0] * DIM}, {"index": 1, "embedding": "A?"}], "base64"),
        ([{"index": 0, "embedding": [0.0] * DIM}, {"index": 1, "embedding": 7}], "not a list"),
        ([{"index": 0, "embedding": [0.0] * DIM}, [0.0] * DIM], "not an object"),
    ],
)
async def test_openai_rejects_malformed_data(data: object, fragment: str) -> None:
    embedder = await _openai_answering(data)
    try:
        with pytest.raises(ResultInvalid, match=fragment):
            await embedder.embed(["a", "b"])
    finally:
        await embedder.aclose()


def _b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


def test_base64_vectors_read_as_their_float32_values() -> None:
    rows = [[1.0, -0.5, 0.1], [3e38, -0.0, 1e-45]]
    expected = np.asarray(rows, dtype=np.float32).tolist()
    assert (
        validate_vectors(
            [_b64(r) for r in rows], expected_count=2, dimension=3, base64_allowed=True
        ).tolist()
        == expected
    )
    # a server may answer lists for some and strings for others: both read alike
    mixed = validate_vectors(
        [expected[0], _b64(rows[1])], expected_count=2, dimension=3, base64_allowed=True
    )
    assert mixed.tolist() == expected
    # without base64_allowed (TEI, the local model) a string is still not a vector
    with pytest.raises(ResultInvalid, match="vector 0 is not a list"):
        validate_vectors([_b64(r) for r in rows], expected_count=2, dimension=3)


@pytest.mark.parametrize(
    ("second", "fragment"),
    [
        (_b64([0.0, 1.0]), "vector 1 has dimension 2, expected 3"),
        (_b64([0.0, 1.0, 2.0, 3.0]), "vector 1 has dimension 4, expected 3"),
        ("AAAAAAAAAAAAAAA=", "vector 1 is not a whole number of float32 values"),
        ("not base64!", "vector 1 is not valid base64"),
        # only the standard alphabet, whole: no other characters, space or padding past the end
        ("AAAAAAAA\u00e9AAA", "vector 1 is not valid base64"),
        ("AAAAAAAA AAA", "vector 1 is not valid base64"),
        ("AAAAAAAA-_AA", "vector 1 is not valid base64"),
        (_b64([0.0, 1.0, 2.0]) + "====", "vector 1 is not valid base64"),
        (_b64([0.0, math.nan, 1.0]), "vector 1 holds NaN or Infinity"),
        (_b64([0.0, 1.0, -math.inf]), "vector 1 holds NaN or Infinity"),
    ],
)
def test_base64_vectors_are_checked_like_lists(second: str, fragment: str) -> None:
    for first in (_b64([0.0, 1.0, 2.0]), [0.0, 1.0, 2.0]):  # the all-string pass and the mixed one
        with pytest.raises(ResultInvalid, match=fragment) as caught:
            validate_vectors([first, second], expected_count=2, dimension=3, base64_allowed=True)
        assert second not in str(caught.value)


async def test_openai_reads_numbers_from_a_server_that_ignores_base64() -> None:
    data = [{"index": i, "embedding": [0.25 * (i + 1)] * DIM} for i in range(2)]
    embedder = await _openai_answering(data)
    try:
        assert (await embedder.embed(["a", "b"])).tolist() == [[0.25] * DIM, [0.5] * DIM]
    finally:
        await embedder.aclose()


async def test_openai_without_indexes_takes_list_order() -> None:
    data = [{"embedding": [float(i + 1)] * DIM} for i in range(2)]
    embedder = await _openai_answering(data)
    try:
        assert (await embedder.embed(["a", "b"])).tolist() == [[1.0] * DIM, [2.0] * DIM]
    finally:
        await embedder.aclose()


async def test_fault_mix_never_yields_a_bad_vector(server: FakeEmbedServer) -> None:
    """The chaos invariant in small: every call returns exactly the right vectors or fails."""
    server.set_fault_rates(
        {
            "status_503": 0.06,
            "status_429": 0.06,
            "status_422": 0.04,
            "disconnect": 0.05,
            "malformed": 0.04,
            "null_vector": 0.04,
            "wrong_count": 0.04,
            "wrong_dimension": 0.04,
            "nan": 0.04,
            "infinity": 0.04,
        },
        seed=11,
    )
    outcomes: dict[str, int] = {}
    with trio.fail_after(30):
        for api in HTTP_APIS:
            embedder = await open_http(server, api, batch_size=2, max_in_flight=2)
            try:
                for call in range(30):
                    items = texts(4, f"{api}-{call}")
                    try:
                        vectors = (await embedder.embed(items)).tolist()
                    except StepFailure as exc:
                        outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                    else:
                        assert vectors == [served(t, api) for t in items]
                        outcomes["ok"] = outcomes.get("ok", 0) + 1
            finally:
                await embedder.aclose()
    assert set(outcomes) == {"ok", "ProviderUnavailable", "ResultInvalid", "ProviderRejectedInput"}
    assert sum(server.stats().faults.values()) > 0


# -- secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", HTTP_APIS)
async def test_api_key_is_sent_as_bearer_and_never_shown(
    server: FakeEmbedServer, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(10):
        embedder = await open_http(server, api, api_key=API_KEY)
        try:
            await embedder.embed(["hello"])
            assert server.stats().last_authorization == f"Bearer {API_KEY}"
            server.set_mode("status", status=401)
            with pytest.raises(ProviderUnavailable) as caught:
                await embedder.embed(["hello"])
        finally:
            await embedder.aclose()
    assert "embedding.api-key" in caught.value.message
    for text in (caplog.text, caught.value.message, repr(embedder), repr(embedder.info)):
        assert API_KEY not in text


async def test_url_credentials_become_basic_auth_and_stay_out_of_logs(
    server: FakeEmbedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("http://", "http://user:pw-do-not-leak@")
    with trio.fail_after(10):
        embedder = await open_http(server, "tei", url=url)
        try:
            await embedder.embed(["hello"])
        finally:
            await embedder.aclose()
    assert (server.stats().last_authorization or "").startswith("Basic ")
    assert "pw-do-not-leak" not in caplog.text


# -- configuration ------------------------------------------------------------------------


async def test_unknown_api_is_a_config_error_naming_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"embedding\.api.*'grpc'"):
        await open_embedder(
            api="grpc",
            url="http://127.0.0.1:1",
            model="m",
            dimension=4,
            batch_size=1,
            max_in_flight=1,
            request_timeout=1.0,
        )


@pytest.mark.parametrize(
    ("url", "key"),
    [(None, "embedding.url"), ("ftp://u:secret-pw@host/", "embedding.url")],
)
async def test_http_api_needs_an_http_url(url: str | None, key: str) -> None:
    with pytest.raises(ConfigError, match=key) as caught:
        await open_embedder(
            api="tei",
            url=url,
            model="m",
            dimension=4,
            batch_size=1,
            max_in_flight=1,
            request_timeout=1.0,
        )
    assert "secret-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"dimension": 0}, "embedding.dimension"),
        ({"batch_size": 0}, "embedding.batch-size"),
        ({"max_in_flight": 0}, "embedding.max-in-flight"),
        ({"request_timeout": 0.0}, "embedding.request-timeout"),
        ({"model": " "}, "embedding.model"),
    ],
)
async def test_invalid_limits_are_config_errors(setting: dict[str, object], key: str) -> None:
    arguments: dict[str, object] = {
        "api": "openai",
        "url": "http://127.0.0.1:1",
        "model": "m",
        "dimension": 4,
        "batch_size": 1,
        "max_in_flight": 1,
        "request_timeout": 1.0,
        **setting,
    }
    with pytest.raises(ConfigError, match=key):
        await open_embedder(**arguments)  # type: ignore[arg-type]


def test_fake_server_control_routes(server: FakeEmbedServer) -> None:
    """The chaos run steers a standalone server over HTTP; its stats carry counts only."""
    body = {"inputs": ["payload-text-5e1f"]}
    auth = {"Authorization": "Bearer secret-key-93ab"}
    with httpx.Client(base_url=server.url, headers=auth) as client:
        assert client.post("/_fake/mode", json={"kind": "status", "status": 503}).is_success
        assert client.post("/embed", json=body).status_code == 503
        rates = {"rates": {"nan": 1.0}, "seed": 3}
        assert client.post("/_fake/mode", json={"kind": "normal"}).is_success
        assert client.post("/_fake/fault-rates", json=rates).is_success
        assert "NaN" in client.post("/embed", json=body).text
        raw = client.get("/_fake/stats").text
    stats = json.loads(raw)
    assert stats["embed_requests"] == 2
    assert stats["faults"] == {"status_503": 1, "nan": 1}
    # the server kept the last payload and key (server.stats() has them); the route must not
    assert server.stats().last_authorization == auth["Authorization"]
    assert "payload-text-5e1f" not in raw
    assert "secret-key-93ab" not in raw


async def test_an_answer_is_freed_without_waiting_for_the_cyclic_collector() -> None:
    """httpx binds a response's stream to the response (a cycle); the transport breaks it, so
    a large document's hundreds of answers do not pile up until a full collection."""
    answers: list[weakref.ref[httpx.Response]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        response = httpx.Response(200, json={"object": "list", "data": [[0.5] * DIM]})
        answers.append(weakref.ref(response))
        return response

    http = HttpTransport.open(
        url="http://embedder.invalid",
        request_timeout=5.0,
        max_connections=1,
        api_key=None,
        transport=httpx.MockTransport(handler),
    )
    gc.disable()
    try:
        assert await http.post_json("/embed", {"inputs": ["a"]}) == {
            "object": "list",
            "data": [[0.5] * DIM],
        }
        assert len(answers) == 1 and answers[0]() is None
    finally:
        gc.enable()
        await http.aclose()
