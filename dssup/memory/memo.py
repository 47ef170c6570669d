"""Memoisation keyed by a model's identity, for the planner's hot paths.

Why: ``functools.lru_cache`` hashes its arguments on every call, and a pydantic ``ModelSpec``
hashes field by field (nested MoE and MLA specs included): in the parallelism search, that
hashing cost more than the arithmetic the caches saved. A plan uses one ``ModelSpec`` object
throughout, so these caches key on ``id(m)``; each entry keeps its model alive, so an id is
never reused while its entry exists, and a table is cleared whole once it grows past its size.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from dssup.memory.spec import ModelSpec

__all__ = ["ModelMemo"]

T = TypeVar("T")


class ModelMemo:
    """One cache table: ``get(m, key, make)`` is ``make()``, computed once per (model, key)."""

    __slots__ = ("size", "table")

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self.table: dict[tuple[int, Hashable], tuple[ModelSpec, object]] = {}

    def get(self, m: ModelSpec, key: Hashable, make: Callable[[], T]) -> T:
        k = (id(m), key)
        hit = self.table.get(k)
        if hit is not None:
            return hit[1]  # type: ignore[return-value]
        if len(self.table) >= self.size:
            self.table.clear()
        value = make()
        self.table[k] = (m, value)
        return value
