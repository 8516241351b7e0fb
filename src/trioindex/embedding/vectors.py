"""Vector checks and the vector hash: the only gate between an embedder's answer and a caller.

Every provider passes its raw, parsed answer through :func:`validate_vectors`; a vector that fails
is never returned, cached or skipped (skipping one would shift every later vector onto the wrong
chunk), the whole call fails with :class:`~trioindex.errors.ResultInvalid`.

A vector must also have a direction: one whose Euclidean norm is below :data:`MIN_NORM` (an
all-zero answer, say) has no cosine with anything, and pgvector would score it NaN against every
query, so it is refused like a NaN element, both when a chunk's vector is stored and when a
query is embedded.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from trioindex.errors import ResultInvalid

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# The largest finite IEEE-754 binary32 value: pgvector stores float4 and the hash packs binary32,
# so anything beyond it is as unusable as an infinity.
FLOAT32_MAX = 3.4028234663852886e38
#: The shortest vector accepted. Embeddings have norms near 1 (most models normalise them) or
#: larger; pgvector computes cosines in float32, where the squared norm of a vector near 1e-19
#: underflows to zero (and the cosine becomes NaN). 1e-6 is far from both.
MIN_NORM = 1e-6
#: Answers of at most this many values (a search's query vectors) are checked in plain Python,
#: without numpy: importing it costs a searching process more than the whole check.
SMALL_ANSWER: Final = 4096


def vector_sha256(vector: Sequence[float]) -> str:
    """SHA-256, lower-case hex, of ``vector`` as IEEE-754 binary32 big-endian bytes.

    Big-endian is the byte order of Java's ``ByteBuffer``, so hashes match the original system.
    """
    return hashlib.sha256(struct.pack(f">{len(vector)}f", *vector)).hexdigest()


def validate_vectors(
    vectors: object, *, expected_count: int, dimension: int, base64_allowed: bool = False
) -> list[list[float]]:
    """Return ``vectors`` as fresh lists of floats, or raise :class:`ResultInvalid`.

    Checks, in order: a list of ``expected_count`` items; each a list (never null) of exactly
    ``dimension`` numbers (``bool`` is not a number here); each finite and within binary32 range;
    then every vector's norm at least :data:`MIN_NORM`. With ``base64_allowed`` (the OpenAI
    API's ``encoding_format: "base64"``) a vector may also be a string: base64 of ``dimension``
    little-endian binary32 values, each finite. Messages name the position and the rule, never
    a value.
    """
    if not isinstance(vectors, list):
        raise ResultInvalid(f"embedding response is not a list of vectors ({_kind(vectors)})")
    if len(vectors) != expected_count:
        raise ResultInvalid(
            f"embedding response has {len(vectors)} vectors for {expected_count} inputs"
        )
    if base64_allowed and vectors and all(type(vector) is str for vector in vectors):
        return _from_base64(vectors, dimension)
    if len(vectors) * dimension > SMALL_ANSWER:
        fast = _fast_path(vectors, dimension)
        if fast is not None:
            return fast
    # Something is off: the exact, element-by-element pass finds it and names it.
    checked: list[list[float]] = []
    for position, vector in enumerate(vectors):
        if vector is None:
            raise ResultInvalid(f"embedding vector {position} is null")
        if base64_allowed and type(vector) is str:
            checked.extend(_from_base64([vector], dimension, first=position))
            continue
        if not isinstance(vector, list):
            raise ResultInvalid(f"embedding vector {position} is not a list ({_kind(vector)})")
        if len(vector) != dimension:
            raise ResultInvalid(
                f"embedding vector {position} has dimension {len(vector)}, expected {dimension}"
            )
        floats: list[float] = []
        for value in vector:
            # type() rather than isinstance(): bool is an int subclass and must not pass.
            if type(value) is not float and type(value) is not int:
                raise ResultInvalid(
                    f"embedding vector {position} holds a non-number ({_kind(value)})"
                )
            number = float(value)
            if not math.isfinite(number):
                raise ResultInvalid(f"embedding vector {position} holds NaN or Infinity")
            if abs(number) > FLOAT32_MAX:
                raise ResultInvalid(f"embedding vector {position} holds a value beyond float32")
            floats.append(number)
        checked.append(floats)
    _check_row_norms(checked)
    return checked


def _check_row_norms(rows: Sequence[Sequence[float]], *, first: int = 0) -> None:
    """:func:`_check_norms` for rows of finite Python floats, without numpy (``math.hypot``
    neither overflows nor underflows on float32-range values)."""
    for offset, row in enumerate(rows):
        if math.hypot(*row) < MIN_NORM:
            raise ResultInvalid(_short_message(first + offset))


def _short_message(position: int) -> str:
    return (
        f"embedding vector {position} has a zero or near-zero norm "
        f"(below {MIN_NORM:g}): it has no direction to rank by"
    )


def _check_norms(matrix: npt.NDArray[np.floating[Any]], *, first: int = 0) -> None:
    """:class:`ResultInvalid` naming the first row of ``matrix`` (finite values, row ``i`` being
    vector ``first + i``) whose norm is below :data:`MIN_NORM`."""
    import numpy as np

    # in float64, where the squares of float32-range values neither overflow nor underflow
    short = np.linalg.norm(matrix.astype(np.float64, copy=False), axis=1) < MIN_NORM
    if short.any():
        raise ResultInvalid(_short_message(first + int(np.argmax(short))))


_NUMBER_TYPES = frozenset({float, int})


def _fast_path(vectors: list[object], dimension: int) -> list[list[float]] | None:
    """The common, valid answer checked in C-speed passes; ``None`` means "look closer".

    A 1024-dimension vector costs ~80 µs through the element loop below and a few µs here
    (type scan with ``map``, then one numpy pass for finiteness and range). Anything unusual —
    a null, a non-list, a wrong length, a bool or string, NaN, ±Infinity, a value beyond float32
    — returns ``None`` so the exact pass raises the precise error.
    """
    import numpy as np

    for vector in vectors:
        if type(vector) is not list or len(vector) != dimension:
            return None
        if not set(map(type, vector)) <= _NUMBER_TYPES:
            return None
    if not vectors:
        return []
    array = np.asarray(vectors, dtype=np.float64)
    if not np.isfinite(array).all() or float(np.abs(array).max()) > FLOAT32_MAX:
        return None
    _check_norms(array)
    result: list[list[float]] = array.tolist()
    return result


def _from_base64(vectors: list[object], dimension: int, *, first: int = 0) -> list[list[float]]:
    """Base64 vectors (strings) decoded as little-endian binary32 and checked: the whole answer
    in one numpy pass, ~7x cheaper than parsing and checking the same vectors as JSON numbers
    (and a quarter of the bytes on the wire)."""
    raw: list[bytes] = []
    for offset, vector in enumerate(vectors):
        position = first + offset
        try:
            decoded = base64.b64decode(str(vector), validate=True)
        except ValueError:  # binascii.Error is a ValueError
            raise ResultInvalid(f"embedding vector {position} is not valid base64") from None
        if len(decoded) != 4 * dimension:
            if len(decoded) % 4:
                raise ResultInvalid(
                    f"embedding vector {position} is not a whole number of float32 values"
                )
            raise ResultInvalid(
                f"embedding vector {position} has dimension {len(decoded) // 4}, "
                f"expected {dimension}"
            )
        raw.append(decoded)
    if len(raw) * dimension <= SMALL_ANSWER:
        rows = [list(struct.unpack(f"<{dimension}f", decoded)) for decoded in raw]
        for offset, row in enumerate(rows):
            if not all(map(math.isfinite, row)):
                raise ResultInvalid(f"embedding vector {first + offset} holds NaN or Infinity")
        _check_row_norms(rows, first=first)
        return rows
    import numpy as np

    matrix = np.frombuffer(b"".join(raw), dtype="<f4").reshape(len(raw), dimension)
    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        position = first + int(np.argmin(finite))
        raise ResultInvalid(f"embedding vector {position} holds NaN or Infinity")
    _check_norms(matrix, first=first)
    result: list[list[float]] = matrix.tolist()
    return result


def _kind(value: object) -> str:
    """A value's type name: safe to put in a message, unlike the value itself."""
    return "null" if value is None else type(value).__name__
