"""Which GPU a pod will get, as real jobs state it.

Jobs rarely name the GPU Feature Discovery product (``nvidia.com/gpu.product``). They pick nodes
by instance type (EKS ``node.kubernetes.io/instance-type: p5.48xlarge``), by GKE's
``cloud.google.com/gke-accelerator``, by a cluster's own labels, or they request MIG slices
(``nvidia.com/mig-1g.10gb``) or AMD GPUs (``amd.com/gpu``). In that order of trust:

1. a MIG resource names its slice (memory in its name);
2. the GFD product label in the node selector or a required node-affinity ``In`` term;
3. any other node selector / required affinity resolved against the Node cache: the GFD
   products of the GPU Nodes whose labels match (several: the smallest GPU counts);
4. a built-in map of common cloud instance types and accelerator labels (the fallback when no
   matching Node is cached, e.g. ``dssup admit`` offline or nodes scaled to zero).

Nothing matched: no product, and the policy answers ``unknown-gpu`` naming what it saw.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.instances import INSTANCE_GPUS, INSTANCE_LABELS
from dssup.admission.nodegpu import AMD_PRODUCT_LABEL, GPU_PRODUCT_LABEL
from dssup.admission.view import annotation_ref

__all__ = [
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCES",
    "container_gpus",
    "downward_annotations",
    "node_terms",
    "products",
]

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)$")


def _quantity(value: Any) -> int | None:
    """A whole-number quantity; None when absent; -1 when unreadable."""
    if value is None:
        return None
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if text.isascii() and text.isdigit() else -1


def container_gpus(c: Mapping[str, Any], notes: list[str]) -> tuple[int, tuple[str, ...]]:
    """(GPUs of the container, the resource names counted): limits, else requests."""
    res = c.get("resources")
    if not isinstance(res, Mapping):
        return 0, ()
    total, names = 0, []
    for field in ("limits", "requests"):
        block = res.get(field)
        if not isinstance(block, Mapping):
            continue
        for raw_key, raw in block.items():
            key = str(raw_key)
            if key not in GPU_RESOURCES and not _MIG_RESOURCE.match(key):
                continue
            if key in names:  # stated in limits: requests equal it (or are ignored)
                continue
            n = _quantity(raw)
            if n is None or n < 0:
                note = f"unreadable: container {c.get('name', '?')} {key} {raw!r}"
                if note not in notes:
                    notes.append(note)
                continue
            names.append(key)
            total += n
    return total, tuple(names)


def _mig(containers: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    found: list[str] = []
    for c in containers:
        res = c.get("resources")
        for field in ("limits", "requests"):
            block = res.get(field) if isinstance(res, Mapping) else None
            for key in block if isinstance(block, Mapping) else ():
                m = _MIG_RESOURCE.match(str(key))
                if m and m.group(1) not in found:
                    found.append(m.group(1))
    return tuple(found)


def node_terms(pod: Mapping[str, Any]) -> list[list[tuple[str, str, tuple[str, ...]]]]:
    """The pod's node requirements: one list of (key, operator, values) per alternative (the
    node selector is added to every alternative, as the scheduler does)."""
    sel = pod.get("nodeSelector")
    base: list[tuple[str, str, tuple[str, ...]]] = [
        (str(k), "In", (str(v),))
        for k, v in (sel.items() if isinstance(sel, Mapping) else ())
        if isinstance(v, (str, int))
    ]
    aff = pod.get("affinity")
    na = aff.get("nodeAffinity") if isinstance(aff, Mapping) else None
    req = (
        na.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(na, Mapping)
        else None
    )
    raw_terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
    alternatives: list[list[tuple[str, str, tuple[str, ...]]]] = []
    for term in raw_terms if isinstance(raw_terms, list) else ():
        exprs = term.get("matchExpressions") if isinstance(term, Mapping) else None
        reqs = list(base)
        for e in exprs if isinstance(exprs, list) else ():
            if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
                continue
            values = e.get("values")
            vals = tuple(str(v) for v in values) if isinstance(values, list) else ()
            reqs.append((e["key"], str(e.get("operator", "")), vals))
        alternatives.append(reqs)
    return alternatives or [base]


def _labelled(terms: list[list[tuple[str, str, tuple[str, ...]]]], label: str) -> tuple[str, ...]:
    found: list[str] = []
    for reqs in terms:
        for key, op, vals in reqs:
            if key == label and op == "In":
                found.extend(v for v in vals if v not in found)
    return tuple(found)


def _instance(terms: list[list[tuple[str, str, tuple[str, ...]]]]) -> tuple[str, ...]:
    found: list[str] = []
    for label in INSTANCE_LABELS:
        for value in _labelled(terms, label):
            v = value.strip().lower().removeprefix("ml.")  # SageMaker HyperPod: ml.g5.8xlarge
            product = INSTANCE_GPUS.get(v) or INSTANCE_GPUS.get(v.split(".", 1)[0])
            if product and product not in found:
                found.append(product)
    return tuple(found)


def products(
    pod: Mapping[str, Any],
    containers: Sequence[Mapping[str, Any]],
    cache: ClusterCache,
    notes: list[str],
) -> tuple[str, ...]:
    """GPU products the pod may land on (the smallest of several counts)."""
    found = _whole_gpus(pod, cache, notes)
    mig = _mig(containers)
    if mig:  # a MIG slice of the GPU the selector names (or of an unnamed GPU)
        parents = [p for p in found if "-MIG-" not in p.upper()] or ["NVIDIA"]
        return tuple(f"{parent}-MIG-{profile}" for parent in parents for profile in mig)
    return found


def _whole_gpus(pod: Mapping[str, Any], cache: ClusterCache, notes: list[str]) -> tuple[str, ...]:
    terms = node_terms(pod)
    named = _labelled(terms, GPU_PRODUCT_LABEL) or _labelled(terms, AMD_PRODUCT_LABEL)
    if named:
        return named
    if any(reqs for reqs in terms):
        match = getattr(cache, "gpu_products_matching", None)
        found = tuple(match(terms)) if match is not None else ()
        if found:
            return found
        fallback = _instance(terms)
        if fallback:
            notes.append(
                "GPU from the built-in instance map: "
                + ", ".join(fallback)
                + " (no GPU Node cached)"
            )
        return fallback
    return ()


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _ref_path(item: Mapping[str, Any], via: str) -> str | None:
    holder = item.get(via) if via else item
    ref = holder.get("fieldRef") if isinstance(holder, Mapping) else None
    path = ref.get("fieldPath") if isinstance(ref, Mapping) else None
    return path if isinstance(path, str) else None


def downward_annotations(pod: Mapping[str, Any]) -> frozenset[str]:
    """Template annotations the containers read through the downward API (env fieldRef or a
    downwardAPI volume); ``"*"`` when a volume exposes all of them."""
    keys: set[str] = set()
    for c in _items(pod.get("containers")):
        for e in _items(c.get("env")):
            key = annotation_ref(_ref_path(e, "valueFrom"))
            if key is not None:
                keys.add(key)
    for vol in _items(pod.get("volumes")):
        dapi = vol.get("downwardAPI")
        for item in _items(dapi.get("items") if isinstance(dapi, Mapping) else None):
            path = _ref_path(item, "")
            if path == "metadata.annotations":
                keys.add("*")
            elif (key := annotation_ref(path)) is not None:
                keys.add(key)
    return frozenset(keys)
