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
    """One cache table: ``get(m, key, make)`` is ``make()``, computed once per (model, key).
    Entries are kept per model object (the model alive with them), so a lookup is two dict
    reads and an entry costs its key and value only."""

    __slots__ = ("count", "size", "tables")

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self.count = 0
        self.tables: dict[int, tuple[ModelSpec, dict[Hashable, object]]] = {}

    def get(self, m: ModelSpec, key: Hashable, make: Callable[[], T]) -> T:
        held = self.tables.get(id(m))
        if held is not None and held[0] is m:
            table = held[1]
            hit = table.get(key, _MISS)
            if hit is not _MISS:
                return hit  # type: ignore[return-value]
        else:
            table = {}
            self.tables[id(m)] = (m, table)
        if self.count >= self.size:  # cleared whole once past its size
            table = {}
            self.tables = {id(m): (m, table)}
            self.count = 0
        value = make()
        table[key] = value
        self.count += 1
        return value


_MISS = object()
