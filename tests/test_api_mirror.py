"""``SyncIndex`` mirrors ``Index``: every method they share takes the same parameters (names,
kinds, defaults, annotations) and returns the same type, blocking instead of awaited; the
differences are the ones named here. And ``trioindex`` serves the same public names."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import trioindex
from trioindex.api.index import Index
from trioindex.api.sync_index import SyncIndex

#: How each side opens and closes: its own, by design.
INDEX_LIFECYCLE = {"open", "open_sync", "aclose"}
SYNC_LIFECYCLE = {"open", "close"}
#: ``Index`` methods a synchronous program does not get.
ASYNC_ONLY_METHODS = {"search_chunks_many", "open_model"}
#: ``Index`` parameters the blocking twin does not take.
ASYNC_ONLY_PARAMETERS = {
    "search_many": {"hnsw"},
    "ingest": {"show_progress"},
    "wait": {"show_progress"},
}


def public_members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def mirrored() -> list[str]:
    return sorted(public_members(SyncIndex) - SYNC_LIFECYCLE)


def test_syncindex_offers_every_index_method_but_the_named_ones() -> None:
    assert public_members(SyncIndex) - SYNC_LIFECYCLE == (
        public_members(Index) - INDEX_LIFECYCLE - ASYNC_ONLY_METHODS
    )


def _parameters(fn: Callable[..., Any], leave_out: set[str]) -> list[tuple[str, Any, Any, Any]]:
    signature = inspect.signature(fn)
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in signature.parameters.values()
        if p.name not in leave_out
    ]


@pytest.mark.parametrize("name", mirrored())
def test_a_syncindex_method_takes_and_returns_what_the_index_method_does(name: str) -> None:
    ours, theirs = vars(SyncIndex)[name], vars(Index)[name]
    is_property = isinstance(theirs, property)
    if is_property:
        assert isinstance(ours, property)
        ours, theirs = ours.fget, theirs.fget
    assert inspect.iscoroutinefunction(theirs) == (not is_property)
    assert not inspect.iscoroutinefunction(ours)
    assert _parameters(ours, set()) == _parameters(theirs, ASYNC_ONLY_PARAMETERS.get(name, set()))
    assert inspect.signature(ours).return_annotation == inspect.signature(theirs).return_annotation


def test_the_named_differences_are_still_differences() -> None:
    for name, parameters in ASYNC_ONLY_PARAMETERS.items():
        assert parameters <= set(inspect.signature(vars(Index)[name]).parameters)
        assert not parameters & set(inspect.signature(vars(SyncIndex)[name]).parameters)
    assert not ASYNC_ONLY_METHODS & public_members(SyncIndex)


def test_trioindex_serves_the_api_under_its_public_names() -> None:
    assert trioindex.Index is Index
    assert trioindex.SyncIndex is SyncIndex
    for name in trioindex.__all__:
        assert getattr(trioindex, name) is not None
