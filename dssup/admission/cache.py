"""What the webhook knows about the cluster, without calling the API server per request.

``ClusterCache`` is the read interface the policy uses. ``InMemoryCache`` is the store behind
it: the Kubernetes watch loop (``kube_cache.py``) feeds it events, tests and ``dssup admit``
feed it fixtures. Reads are dict lookups on the event loop; writes come from watch threads and
replace whole entries, which is safe under the GIL. ``generation`` counts the writes that change
what a decision can read (not Node heartbeats or unchanged re-lists), so the policy can remember
decisions until the cluster really changes; a write updates the entry first and the counter
second, so a reader that sees the new count also sees the new entry.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dssup.admission.nodegpu import node_gpu

__all__ = ["RUNTIME_KINDS", "ClusterCache", "GpuNodeInfo", "InMemoryCache"]

RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


@dataclass(frozen=True, slots=True)
class GpuNodeInfo:
    """What the GPU labellers (NVIDIA GFD, AMD's ROCm node labeller; ``nodegpu.py``) say about
    the GPUs of one product across the cluster."""

    product: str
    memory_mib: int  # smallest labelled memory among nodes of this product
    replicas: int  # largest time-slicing ``nvidia.com/gpu.replicas`` (1 = not shared)
    nodes: int


class ClusterCache(Protocol):
    """Read side used by the policy. Every method answers from memory."""

    def synced(self) -> bool: ...
    def gpu_product(self, product: str) -> GpuNodeInfo | None: ...
    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None: ...
    def training_runtime(
        self, namespace: str, kind: str, name: str
    ) -> Mapping[str, Any] | None: ...


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _match(labels: Mapping[str, str], key: str, op: str, values: tuple[str, ...]) -> bool:
    """One node-selector requirement (the operators of core/v1 NodeSelectorRequirement)."""
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and values and key in labels:
        a, b = labels[key], values[0]
        if a.isascii() and a.isdigit() and b.isascii() and b.isdigit():
            return int(a) > int(b) if op == "Gt" else int(a) < int(b)
    return False


class InMemoryCache:
    """Nodes, ConfigMaps and (Cluster)TrainingRuntimes by name; fed by events or fixtures."""

    def __init__(self, *, synced: bool = True) -> None:
        self._nodes: dict[str, tuple[str, int, int]] = {}
        self._node_labels: dict[str, Mapping[str, str]] = {}  # GPU nodes only
        self._gpu: dict[str, GpuNodeInfo] | None = None
        self._config_maps: dict[tuple[str, str], Mapping[str, str]] = {}
        self._runtimes: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self._synced = threading.Event()
        self._generation = 0
        if synced:
            self._synced.set()

    # -- write side -------------------------------------------------------------------------
    def mark_synced(self) -> None:
        self._synced.set()
        self._generation += 1

    def _changed(self, before: object, after: object) -> None:
        if before != after:
            self._generation += 1

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """Add or replace one Node, ConfigMap or (Cluster)TrainingRuntime object."""
        kind = obj.get("kind")
        ns, name = _name(obj)
        if kind == "Node":
            labels = _labels(obj)
            gpu = node_gpu(labels)
            before = (self._nodes.get(name), self._node_labels.get(name))
            if gpu is not None:
                self._nodes[name] = gpu
                self._node_labels[name] = {str(k): str(v) for k, v in labels.items()}
            else:
                self._nodes.pop(name, None)
                self._node_labels.pop(name, None)
            if before != (self._nodes.get(name), self._node_labels.get(name)):
                self._gpu = None
                self._generation += 1
        elif kind == "ConfigMap":
            data = obj.get("data")
            key = (ns, name)
            old = self._config_maps.get(key)
            self._config_maps[key] = dict(data) if isinstance(data, Mapping) else {}
            self._changed(old, self._config_maps[key])
        elif kind in RUNTIME_KINDS:
            rkey = (ns if kind == "TrainingRuntime" else "", str(kind), name)
            old_rt = self._runtimes.get(rkey)
            self._runtimes[rkey] = obj
            self._changed(
                None if old_rt is None else (old_rt.get("spec"), _labels(old_rt)),
                (obj.get("spec"), _labels(obj)),
            )

    def delete(self, kind: str, namespace: str, name: str) -> None:
        gone: object = None
        if kind == "Node":
            gone = self._nodes.pop(name, None)
            self._node_labels.pop(name, None)
            self._gpu = None
        elif kind == "ConfigMap":
            gone = self._config_maps.pop((namespace, name), None)
        elif kind in RUNTIME_KINDS:
            key = (namespace if kind == "TrainingRuntime" else "", kind, name)
            gone = self._runtimes.pop(key, None)
        if gone is not None:
            self._generation += 1

    def replace_all(
        self,
        kind: str,
        objects: list[Mapping[str, Any]],
        namespace: str | None = None,
        label: str | None = None,
    ) -> None:
        """The result of a fresh LIST (of one ``namespace`` when given; of the Nodes carrying
        label key ``label`` when given, as one label-selected watch sees them): build the new
        state aside, then swap it in (readers on the event loop never see a half-filled cache)."""
        fresh = InMemoryCache()
        for obj in objects:
            fresh.upsert({**obj, "kind": kind})
        if kind == "Node":

            def listed(labels: Mapping[str, str]) -> bool:
                return label is None or label in labels

            kept = {n for n, lbl in self._node_labels.items() if not listed(lbl)}
            mine = {n for n, lbl in fresh._node_labels.items() if listed(lbl)}
            self._nodes = {
                **{n: self._nodes[n] for n in kept},
                **{n: fresh._nodes[n] for n in mine},
            }
            self._node_labels = {
                **{n: self._node_labels[n] for n in kept},
                **{n: fresh._node_labels[n] for n in mine},
            }
            self._gpu = None
        elif kind == "ConfigMap" and namespace is not None:
            kept_cms = {k: v for k, v in self._config_maps.items() if k[0] != namespace}
            self._config_maps = {**kept_cms, **fresh._config_maps}
        elif kind == "ConfigMap":
            self._config_maps = fresh._config_maps
        else:
            kept_rt = {k: v for k, v in self._runtimes.items() if k[1] != kind}
            self._runtimes = {**kept_rt, **fresh._runtimes}
        self._generation += 1

    # -- read side --------------------------------------------------------------------------
    def synced(self) -> bool:
        return self._synced.is_set()

    def generation(self) -> int:
        """Counts changes that can alter a decision; equal counts mean equal answers."""
        return self._generation

    def _gpu_index(self) -> dict[str, GpuNodeInfo]:
        index = self._gpu
        if index is None:
            index = {}
            for product, memory, replicas in list(self._nodes.values()):
                old = index.get(product)
                if memory <= 0:
                    continue
                if old is None:
                    index[product] = GpuNodeInfo(product, memory, replicas, 1)
                else:
                    index[product] = GpuNodeInfo(
                        product,
                        min(old.memory_mib, memory),
                        max(old.replicas, replicas),
                        old.nodes + 1,
                    )
            self._gpu = index
        return index

    def gpu_product(self, product: str) -> GpuNodeInfo | None:
        return self._gpu_index().get(product)

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._config_maps.get((namespace, name))

    def gpu_products_matching(
        self, terms: list[list[tuple[str, str, tuple[str, ...]]]]
    ) -> list[str]:
        """GFD products of the cached GPU Nodes that satisfy any alternative of ``terms``
        ((key, operator, values) requirements, as ``gpuid.node_terms`` reads them)."""
        found: list[str] = []
        for name, labels in list(self._node_labels.items()):
            if any(all(_match(labels, *req) for req in reqs) for reqs in terms):
                product = self._nodes[name][0] if name in self._nodes else ""
                if product and product not in found:
                    found.append(product)
        return found

    def training_runtime(self, namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        return self._runtimes.get((namespace if kind == "TrainingRuntime" else "", kind, name))
