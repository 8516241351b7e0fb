"""What every embedder answers (:class:`Vectors`), its checks, and the vector hash: the only
gate between an embedder's answer and a caller.

Every provider passes its raw, parsed answer through :func:`validate_vectors` (a local model's
matrix through :meth:`Vectors.checked`); a vector that fails is never returned, cached or
skipped (skipping one would shift every later vector onto the wrong chunk), the whole call
fails with :class:`~trioindex.errors.ResultInvalid`.

A vector must also have a direction: one whose Euclidean norm is below :data:`MIN_NORM` (an
all-zero answer, say) has no cosine with anything, and pgvector would score it NaN against every
query, so it is refused like a NaN element, both when a chunk's vector is stored and when a
query is embedded.
"""

from __future__ import annotations

import array
import hashlib
import math
import struct
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import pybase64

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


@attrs.frozen(eq=False)
class Vectors:
    """``count`` checked vectors of ``dimension`` float32 values, row by row in one buffer: what
    every embedder answers, handed on without a copy to the float32 matrix the worker stores
    (:meth:`matrix`) or to a query's one row (:meth:`row`).

    Made only by :func:`validate_vectors`, :meth:`checked` and :meth:`joined`, so every value
    is finite and every row's norm at least :data:`MIN_NORM`. Holding a buffer rather than a
    numpy array keeps numpy out of a searching process that embeds a few queries.
    """

    count: int
    dimension: int
    # native-order float32, ``count * dimension`` values (a memoryview of format "f")
    _flat: memoryview = attrs.field(repr=False, alias="flat")

    def __len__(self) -> int:
        return self.count

    @classmethod
    def empty(cls, dimension: int) -> Vectors:
        """No vectors."""
        return cls(0, dimension, memoryview(array.array("f")))

    @classmethod
    def checked(
        cls, matrix: npt.NDArray[np.floating[Any]], *, expected_count: int, dimension: int
    ) -> Vectors:
        """A numpy matrix (a local model's answer, a mean of vectors) checked as an answer is:
        ``expected_count`` rows of ``dimension`` values, finite, within float32, each row's
        norm at least :data:`MIN_NORM`; kept as float32 (no copy when it is C-ordered float32
        already)."""
        import numpy as np

        if matrix.ndim != 2 or matrix.shape[0] != expected_count:
            raise ResultInvalid(
                f"embedding response has {len(matrix)} vectors for {expected_count} inputs"
            )
        if matrix.shape[1] != dimension:
            raise ResultInvalid(
                f"embedding vector 0 has dimension {matrix.shape[1]}, expected {dimension}"
            )
        _check_finite(matrix)
        if expected_count and float(np.abs(matrix).max()) > FLOAT32_MAX:
            raise ResultInvalid("embedding response holds a value beyond float32")
        _check_norms(matrix)
        return cls._of_matrix(np.ascontiguousarray(matrix, dtype=np.float32))

    @classmethod
    def _of_matrix(cls, matrix: npt.NDArray[np.float32]) -> Vectors:
        count, dimension = matrix.shape
        # an ndarray is a buffer (numpy's stubs do not say so)
        return cls(count, dimension, memoryview(matrix.reshape(-1)))  # type: ignore[arg-type]

    @classmethod
    def joined(cls, parts: Sequence[Vectors]) -> Vectors:
        """``parts`` (at least one) one after the other (one part: itself, no copy)."""
        if len(parts) == 1:
            return parts[0]
        dimension = parts[0].dimension
        if any(part.dimension != dimension for part in parts):
            raise ResultInvalid("embedding responses of different dimensions")
        joined = array.array("f")
        for part in parts:
            joined.frombytes(part._flat.cast("B"))
        return cls(sum(part.count for part in parts), dimension, memoryview(joined))

    def matrix(self) -> npt.NDArray[np.float32]:
        """The vectors as a read-only ``count`` × ``dimension`` float32 matrix (no copy)."""
        import numpy as np

        matrix = np.frombuffer(self._flat, dtype=np.float32).reshape(self.count, self.dimension)
        matrix.flags.writeable = False
        return matrix

    def row(self, index: int) -> list[float]:
        """Vector ``index`` as Python floats."""
        if not 0 <= index < self.count:
            raise IndexError(f"vector {index} of {self.count}")
        start = index * self.dimension
        values: list[float] = self._flat[start : start + self.dimension].tolist()  # type: ignore[assignment]
        return values

    def tolist(self) -> list[list[float]]:
        """Every vector as Python floats."""
        return [self.row(index) for index in range(self.count)]

    def little_endian(self, index: int) -> bytes:
        """Vector ``index`` as little-endian binary32 bytes (the OpenAI API's base64 payload)."""
        start = index * self.dimension
        row = array.array("f", self._flat[start : start + self.dimension])
        if sys.byteorder == "big":
            row.byteswap()
        return row.tobytes()


def validate_vectors(
    vectors: object,
    *,
    expected_count: int,
    dimension: int,
    base64_allowed: bool = False,
    may_hold_booleans: bool = True,
) -> Vectors:
    """``vectors`` (an embedding server's parsed answer) checked, as :class:`Vectors`; or
    :class:`ResultInvalid`.

    Checks, in order: a list of ``expected_count`` items; each a list (never null) of exactly
    ``dimension`` numbers (``bool`` is not a number here); each finite and within binary32 range;
    then every vector's norm at least :data:`MIN_NORM`. With ``base64_allowed`` (the OpenAI
    API's ``encoding_format: "base64"``) a vector may also be a string: base64 of ``dimension``
    little-endian binary32 values, each finite. Messages name the position and the rule, never
    a value.

    ``may_hold_booleans=False`` is the caller's word that the JSON text ``vectors`` was parsed
    from holds no ``true`` or ``false`` (:func:`json_without_booleans`): a large answer's
    values are then typed by numpy's own type discovery (float64 only when every value is a
    float or an int, ``bool`` aside) rather than by a scan of every value's type first, ~0.6x
    the check's CPU.
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
        fast = _fast_path(vectors, dimension, scan_types=may_hold_booleans)
        if fast is not None:
            return fast
    # Something is off (or the answer is small): the exact, element-by-element pass finds it
    # and names it.
    flat = array.array("f")
    short: int | None = None
    for position, vector in enumerate(vectors):
        if vector is None:
            raise ResultInvalid(f"embedding vector {position} is null")
        if base64_allowed and type(vector) is str:
            flat.frombytes(_from_base64([vector], dimension, first=position)._flat.cast("B"))
            continue
        if not isinstance(vector, list):
            raise ResultInvalid(f"embedding vector {position} is not a list ({_kind(vector)})")
        if len(vector) != dimension:
            raise ResultInvalid(
                f"embedding vector {position} has dimension {len(vector)}, expected {dimension}"
            )
        for value in vector:
            # type() rather than isinstance(): bool is an int subclass and must not pass.
            if type(value) is not float and type(value) is not int:
                raise ResultInvalid(
                    f"embedding vector {position} holds a non-number ({_kind(value)})"
                )
            try:
                number = float(value)
            except OverflowError:  # an integer literal past any float (Python's json reads it)
                raise ResultInvalid(
                    f"embedding vector {position} holds a value beyond float32"
                ) from None
            if not math.isfinite(number):
                raise ResultInvalid(f"embedding vector {position} holds NaN or Infinity")
            if abs(number) > FLOAT32_MAX:
                raise ResultInvalid(f"embedding vector {position} holds a value beyond float32")
        # the norm of the values as given (float64), before they are rounded to float32
        if short is None and math.hypot(*vector) < MIN_NORM:
            short = position
        flat.extend(vector)
    if short is not None:  # the norms are checked once every value is
        raise ResultInvalid(_short_message(short))
    return Vectors(len(vectors), dimension, memoryview(flat))


def _check_finite(matrix: npt.NDArray[np.floating[Any]], *, first: int = 0) -> None:
    """:class:`ResultInvalid` naming the first row of ``matrix`` (numbered from ``first``) that
    holds a NaN or an infinity."""
    import numpy as np

    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        position = first + int(np.argmin(finite))
        raise ResultInvalid(f"embedding vector {position} holds NaN or Infinity")


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


def _fast_path(vectors: list[object], dimension: int, *, scan_types: bool) -> Vectors | None:
    """The common, valid answer checked in C-speed passes; ``None`` means "look closer".

    A 1024-dimension vector costs ~80 µs through the element loop below and ~50 µs here (a
    type scan with ``map``, the conversion, then one numpy pass for finiteness and range), ~30
    without the scan. Anything unusual — a null, a non-list, a wrong length, a bool or string,
    a nested list, NaN, ±Infinity, a value beyond float32 — returns ``None`` so the exact pass
    raises the precise error.
    """
    import numpy as np

    for vector in vectors:
        if type(vector) is not list or len(vector) != dimension:
            return None
        if scan_types and not set(map(type, vector)) <= _NUMBER_TYPES:
            return None
    try:
        # without the scan: numpy makes a string, a null or a nested list another dtype or
        # shape (given float64, it would read "1.5" as a number)
        array64 = np.asarray(vectors, dtype=np.float64 if scan_types else None)
    except (ValueError, TypeError, OverflowError):
        return None
    if array64.dtype != np.float64 or array64.shape != (len(vectors), dimension):
        return None
    if not np.isfinite(array64).all() or float(np.abs(array64).max()) > FLOAT32_MAX:
        return None
    _check_norms(array64)
    return Vectors._of_matrix(array64.astype(np.float32))


def json_without_booleans(text: bytes) -> bool:
    """Whether JSON ``text`` certainly holds no ``true`` or ``false``: it has no ``t`` and no
    ``f`` byte (two ``memchr`` passes). A TEI answer, numbers only, has neither."""
    return b"t" not in text and b"f" not in text


def _from_base64(vectors: list[object], dimension: int, *, first: int = 0) -> Vectors:
    """Base64 vectors (strings) decoded as little-endian binary32 and checked: the whole answer
    in one pass, ~7x cheaper than parsing and checking the same vectors as JSON numbers (and a
    quarter of the bytes on the wire); the decoded bytes are the answer's buffer."""
    raw: list[bytes] = []
    for offset, vector in enumerate(vectors):
        position = first + offset
        try:
            # pybase64: the standard library's strict decoding (and padding past the end
            # refused), with SIMD: 0.6 against 9 µs for a 768-dimension vector
            decoded = pybase64.b64decode(str(vector), validate=True)
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
        flat = array.array("f", b"".join(raw))
        if sys.byteorder == "big":
            flat.byteswap()
        rows = [flat[start : start + dimension] for start in range(0, len(flat), dimension)]
        for offset, row in enumerate(rows):
            if not all(map(math.isfinite, row)):
                raise ResultInvalid(f"embedding vector {first + offset} holds NaN or Infinity")
        for offset, row in enumerate(rows):
            if math.hypot(*row) < MIN_NORM:
                raise ResultInvalid(_short_message(first + offset))
        return Vectors(len(raw), dimension, memoryview(flat))
    import numpy as np

    matrix = np.frombuffer(b"".join(raw), dtype="<f4").reshape(len(raw), dimension)
    _check_finite(matrix, first=first)
    _check_norms(matrix, first=first)
    return Vectors._of_matrix(matrix.astype(np.float32, copy=False))


def _kind(value: object) -> str:
    """A value's type name: safe to put in a message, unlike the value itself."""
    return "null" if value is None else type(value).__name__
