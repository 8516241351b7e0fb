"""A vector without a direction (all zeros, or a norm below MIN_NORM) is refused as
EMBEDDING_RESULT_INVALID wherever an embedder's answer comes in: JSON numbers (the fast and the
exact pass), base64 (OpenAI), a matrix (the local model's answer, a mean of pieces' vectors), and a
TEI client talking to a server that answers zeros."""

from __future__ import annotations

import base64
import math
from typing import Any

import httpx
import numpy as np
import pytest
import trio

from tests.search.zero_embedder import ZERO_MARK, ZeroEmbedServer
from trioindex.embedding import open_embedder
from trioindex.embedding.vectors import (
    MIN_NORM,
    SMALL_ANSWER,
    Vectors,
    json_without_booleans,
    validate_vectors,
)
from trioindex.errors import FailureType, ResultInvalid

UNIT = [0.6, 0.8, 0.0]


def _b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


SHORT = [
    [0.0, 0.0, 0.0],
    [-0.0, 0.0, -0.0],
    [MIN_NORM / 2, 0.0, 0.0],
    [1e-30, -1e-30, 1e-30],
    [1e-45, 0.0, 0.0],  # a float32 subnormal
]


@pytest.mark.parametrize("short", SHORT)
def test_a_vector_without_a_direction_is_refused_and_named(short: list[float]) -> None:
    checked: list[object] = [UNIT, short]
    for vectors, base64_allowed in (
        (checked, False),  # the fast pass
        ([_b64(UNIT), _b64(short)], True),  # all base64
        ([UNIT, _b64(short)], True),  # mixed: the exact pass, base64 decoded alone
        ([_b64(UNIT), short], True),  # mixed: the exact pass, a list
    ):
        with pytest.raises(ResultInvalid, match="vector 1 has a zero or near-zero norm") as caught:
            validate_vectors(
                vectors, expected_count=len(vectors), dimension=3, base64_allowed=base64_allowed
            )
        assert caught.value.failure_type is FailureType.EMBEDDING_RESULT_INVALID


@pytest.mark.parametrize("bad", [*SHORT, [0.6, math.nan, 0.0], [math.inf, 0.0, 0.0]])
def test_a_search_sized_answer_and_a_large_one_are_checked_alike(bad: list[float]) -> None:
    """A few query vectors are checked without numpy (SMALL_ANSWER), a large answer with it:
    the same bad vector is refused with the same message, by its position, either way."""
    many = SMALL_ANSWER // 3 + 1  # rows of UNIT before the bad one: past the small size
    messages = []
    for before in (1, many):
        for encode in (list, _b64):
            vectors = [encode(UNIT)] * before + [encode(bad)]  # type: ignore[operator]
            with pytest.raises(ResultInvalid) as caught:
                validate_vectors(
                    vectors, expected_count=before + 1, dimension=3, base64_allowed=True
                )
            messages.append(str(caught.value).replace(f"vector {before} ", "vector N "))
    assert len(set(messages)) == 1, messages
    assert "vector N " in messages[0]


def test_the_line_is_min_norm() -> None:
    smallest = [MIN_NORM * 1.01, 0.0, 0.0]
    spread = [MIN_NORM / math.sqrt(3) * 1.01] * 3
    for vectors in ([smallest, spread, UNIT], [[3e38, 0.0, 0.0], UNIT]):
        checked = validate_vectors(vectors, expected_count=len(vectors), dimension=3)
        assert np.array_equal(checked.matrix(), np.asarray(vectors, dtype=np.float32))
    with pytest.raises(ResultInvalid, match="vector 1 has a zero or near-zero norm"):
        validate_vectors([smallest, [MIN_NORM * 0.99, 0.0, 0.0]], expected_count=2, dimension=3)


@pytest.mark.parametrize("short", SHORT)
def test_a_matrix_answer_without_a_direction_is_refused(short: list[float]) -> None:
    """A local model's answer (a numpy matrix) meets the norm rule as a server's does."""
    matrix = np.asarray([UNIT, UNIT, short], dtype=np.float64)
    with pytest.raises(ResultInvalid, match="vector 2 has a zero or near-zero norm"):
        Vectors.checked(matrix, expected_count=3, dimension=3)


async def test_an_embedder_answering_zeros_fails_the_call() -> None:
    with ZeroEmbedServer(dimension=3, model="zero-3") as server:
        embedder = await open_embedder(
            api="tei", url=server.url, model="zero-3", dimension=3, batch_size=8,
            max_in_flight=2, request_timeout=5.0, api_key=None,
        )  # fmt: skip
        try:
            assert len(await embedder.embed(["a", "b"])) == 2
            with pytest.raises(ResultInvalid, match="vector 1 has a zero or near-zero norm"):
                await embedder.embed(["a", f"{ZERO_MARK} b", "c"])
        finally:
            with trio.CancelScope(shield=True):
                await embedder.aclose()


def test_a_large_base64_answer_decodes_as_a_small_one() -> None:
    many = SMALL_ANSWER // 3 + 1  # past the small size: the numpy pass
    values = [[0.6, -0.8, 1e-3], [2.5, 0.0, -7.25]]
    small = validate_vectors([_b64(v) for v in values], expected_count=2, dimension=3,
                             base64_allowed=True)  # fmt: skip
    large = validate_vectors(
        [_b64(v) for v in values] * many,
        expected_count=2 * many,
        dimension=3,
        base64_allowed=True,
    )
    assert small.tolist() == [pytest.approx(v, rel=1e-6) for v in values]
    assert large.tolist() == small.tolist() * many


@pytest.mark.parametrize(
    ("matrix", "fragment"),
    [
        (np.asarray([UNIT, [0.6, math.nan, 0.0]]), "vector 1 holds NaN or Infinity"),
        (np.asarray([[math.inf, 0.0, 0.0], UNIT]), "vector 0 holds NaN or Infinity"),
        (np.asarray([UNIT, [3.5e38, 0.0, 0.0]]), "a value beyond float32"),
        (np.asarray([UNIT]), "has 1 vectors for 2 inputs"),
        (np.asarray([[*UNIT, 0.0], [*UNIT, 0.0]]), "has dimension 4, expected 3"),
        (np.asarray(UNIT), "has 3 vectors for 2 inputs"),  # one vector, not a matrix
    ],
)
def test_a_matrix_answer_is_checked_like_a_server_answer(matrix: Any, fragment: str) -> None:
    """A local model's answer: the count, the dimension, finite values within float32."""
    with pytest.raises(ResultInvalid, match=fragment) as caught:
        Vectors.checked(matrix, expected_count=2, dimension=3)
    assert caught.value.failure_type is FailureType.EMBEDDING_RESULT_INVALID


def test_vectors_hand_on_their_rows_without_a_copy() -> None:
    """A checked float32 matrix is the answer's buffer: the worker's matrix is a view of it,
    a query's row its values as floats, the lender's bytes little-endian float32."""
    matrix = np.asarray([UNIT, [0.0, 0.28, 0.96]], dtype=np.float32)
    vectors = Vectors.checked(matrix, expected_count=2, dimension=3)
    view = vectors.matrix()
    assert np.shares_memory(view, matrix) and not view.flags.writeable
    assert vectors.row(1) == matrix[1].tolist()
    assert vectors.little_endian(0) == matrix[0].astype("<f4").tobytes()
    joined = Vectors.joined([vectors, vectors])
    assert joined.tolist() == matrix.tolist() * 2
    assert Vectors.joined([vectors]) is vectors
    with pytest.raises(IndexError):
        vectors.row(2)


MANY = SMALL_ANSWER // 3 + 1  # rows of UNIT: past the small size, the numpy pass


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ([0.6, "0.8", 0.0], "vector 1 holds a non-number"),
        ([0.6, None, 0.0], "vector 1 holds a non-number"),
        ([0.6, {}, 0.0], "vector 1 holds a non-number"),
        ([0.6, [0.8], 0.0], "vector 1 holds a non-number"),
        ([[0.6], [0.8], [0.0]], "vector 1 holds a non-number"),  # every value nested alike
        ([0.6, 10**400, 0.0], "vector 1 holds a value beyond float32"),
        ([0.6, 1e39, 0.0], "vector 1 holds a value beyond float32"),
        ([0.6, math.nan, 0.0], "vector 1 holds NaN or Infinity"),
        ([0.6, -math.inf, 0.0], "vector 1 holds NaN or Infinity"),
        ([0.6, 0.8], "vector 1 has dimension 2, expected 3"),
        ([0.0, 0.0, 0.0], "vector 1 has a zero or near-zero norm"),
    ],
)
def test_an_answer_without_booleans_is_checked_as_closely(bad: list[object], fragment: str) -> None:
    """A caller that saw no ``true``/``false`` in the JSON text skips the per-value type scan:
    every other bad value is still refused, with the same message."""
    vectors = [UNIT, bad, *[UNIT] * MANY]
    for may_hold_booleans in (True, False):
        with pytest.raises(ResultInvalid, match=fragment):
            validate_vectors(
                vectors,
                expected_count=len(vectors),
                dimension=3,
                may_hold_booleans=may_hold_booleans,
            )


def test_an_answer_without_booleans_reads_as_one_with_them() -> None:
    vectors: list[object] = [[1, 0.5, -2], *[UNIT] * MANY]  # ints too: numbers
    scanned = validate_vectors(vectors, expected_count=len(vectors), dimension=3)
    typed = validate_vectors(
        vectors, expected_count=len(vectors), dimension=3, may_hold_booleans=False
    )
    assert typed.tolist() == scanned.tolist()
    assert typed.row(0) == [1.0, 0.5, -2.0]


def test_json_without_booleans() -> None:
    assert json_without_booleans(b"[[0.5,-1.25e-7,0.0],[1,2,3]]")
    assert json_without_booleans(b"[[NaN]]")  # not a boolean: the value check refuses it
    assert not json_without_booleans(b"[[0.5,true]]")
    assert not json_without_booleans(b"[[false,0.5]]")
    assert not json_without_booleans(b'{"object":"list"}')


async def test_a_tei_answer_holding_a_boolean_is_refused() -> None:
    """The TEI client looks at the answer's text: a ``true`` among a large answer's numbers
    is refused, not read as 1.0."""
    dimension, count = 1024, 8  # past the small size
    row = ",".join(["0.03125"] * (dimension - 1))

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(404)
        body = ",".join([f"[{row},0.5]"] * (count - 1) + [f"[{row},true]"])
        return httpx.Response(200, content=f"[{body}]".encode())

    embedder = await open_embedder(
        api="tei",
        url="http://embedder.invalid",
        model="m",
        dimension=dimension,
        batch_size=count,
        max_in_flight=1,
        request_timeout=5.0,
        transport=httpx.MockTransport(handler),
    )
    try:
        with pytest.raises(ResultInvalid, match=f"vector {count - 1} holds a non-number"):
            await embedder.embed([f"text {i}" for i in range(count)])
    finally:
        await embedder.aclose()
