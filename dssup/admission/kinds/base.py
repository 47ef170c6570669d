"""What every kind reader is: a group, versions, a kind, a reader and where it is suspended."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.podspec import as_map
from dssup.admission.view import PodSetView

__all__ = ["Context", "KindReader", "spec_flag"]


@dataclass(slots=True)
class Context:
    """What a reader needs and what it reports besides pod sets."""

    cache: ClusterCache
    namespace: str
    notes: list[str]  # what could not be read ("cache miss: ...", "unreadable: ...", ...)
    model_refs: list[tuple[str, str]]  # (where, reference) the kind itself states


@dataclass(frozen=True, slots=True)
class KindReader:
    group: str
    versions: tuple[str, ...]
    kind: str
    read: Callable[[Mapping[str, Any], Context], list[PodSetView]]
    suspend_path: tuple[str, ...] = ("spec", "suspend")

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return spec_flag(obj, self.suspend_path)


def spec_flag(obj: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = obj
    for key in path:
        node = as_map(node).get(key)
    return node is True
