"""Normalise PyTorchJob, TrainJob, JobSet, batch Job and bare Pod objects into a ``JobView``.

Each reader knows only where its kind keeps pod templates and replica counts; pod-template
reading (containers, GPUs, node selection, ConfigMap volumes) is shared. Readers never raise on
odd input: a missing or mistyped field yields an empty pod set plus a note, so a strange object
is answered (allowed, with a warning) instead of crashing the webhook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.view import ContainerView, EnvVar, JobView, PodSetView, escape

__all__ = ["GPU_PRODUCT_LABEL", "GPU_RESOURCE", "SUPPORTED", "is_controlled", "normalise"]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
_EMPTY: Mapping[str, Any] = {}

Reader = Callable[[Mapping[str, Any], str, ClusterCache, list[str]], list[PodSetView]]


_SCALARS = frozenset({str, int, float, bool, list, type(None)})
_STR_ONLY = frozenset({str})


def _map(value: Any) -> Mapping[str, Any]:
    kind = type(value)
    if kind is dict:  # the common case, without the (slow) ABC check
        return value  # type: ignore[no-any-return]
    if kind in _SCALARS:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any, default: int) -> int:
    if value is None:  # the common case for optional counts
        return default
    if type(value) is int:  # a JSON integer (not a bool: type, not isinstance)
        return value
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return default


def _strs(value: Any) -> tuple[str, ...]:
    items = _list(value)
    if set(map(type, items)) <= _STR_ONLY:  # the common case: a list of strings
        return tuple(items)
    return tuple(
        str(v) for v in items if isinstance(v, (str, int, float)) and not isinstance(v, bool)
    )


def _config_map_ref(value_from: Any) -> tuple[str, str] | None:
    ref = _map(_map(value_from).get("configMapKeyRef"))
    return (str(ref.get("name", "")), str(ref.get("key", ""))) if ref else None


def _gpus(container: Mapping[str, Any]) -> int:
    res = _map(container.get("resources"))
    limit = _int(_map(res.get("limits")).get(GPU_RESOURCE), -1)
    return limit if limit >= 0 else max(0, _int(_map(res.get("requests")).get(GPU_RESOURCE), 0))


def _env(items: Any) -> tuple[EnvVar, ...]:
    out = []
    for i, raw in enumerate(_list(items)):
        item = _map(raw)
        name = item.get("name")
        if not isinstance(name, str):
            continue
        value_from = item.get("valueFrom")  # usually absent: a literal value
        cm = None if value_from is None else _config_map_ref(value_from)
        value = item.get("value")
        out.append(EnvVar(name, str(value) if value is not None else None, cm, i))
    return tuple(out)


def _products(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """GPU products the pod may land on: node selector, else required node affinity terms."""
    selected = _map(pod.get("nodeSelector")).get(GPU_PRODUCT_LABEL)
    if isinstance(selected, str) and selected:
        return (selected,)
    required = _map(
        _map(_map(pod.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    found: list[str] = []
    for term in _list(required.get("nodeSelectorTerms")):
        for raw_expr in _list(_map(term).get("matchExpressions")):
            expr = _map(raw_expr)
            if expr.get("key") == GPU_PRODUCT_LABEL and expr.get("operator") == "In":
                found.extend(v for v in _strs(expr.get("values")) if v not in found)
    return tuple(found)


def _cm_volumes(pod: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, str]]]:
    out: dict[str, tuple[str, Mapping[str, str]]] = {}
    for raw_vol in _list(pod.get("volumes")):
        vol = _map(raw_vol)
        cm = _map(vol.get("configMap"))
        if isinstance(vol.get("name"), str) and isinstance(cm.get("name"), str):
            items = {
                str(_map(i).get("key")): str(_map(i).get("path")) for i in _list(cm.get("items"))
            }
            out[vol["name"]] = (cm["name"], items)
    return out


def _container(c: Mapping[str, Any], path: str) -> ContainerView:
    raw_mounts = c.get("volumeMounts")
    mounts = (
        tuple(
            [
                (str(_map(m).get("name", "")), str(_map(m).get("mountPath", "")))
                for m in _list(raw_mounts)
            ]
        )
        if raw_mounts
        else ()
    )
    # Positional: a NamedTuple built from keywords costs about 2.5 times as much, and several
    # views are built per review. The order is ContainerView's field order.
    return ContainerView(
        str(c.get("name", "")),
        _strs(c.get("command")),
        _strs(c.get("args")),
        _env(c.get("env")),
        _gpus(c),
        mounts,
        f"{path}/command",
        f"{path}/args",
        f"{path}/env",
        "command" in c,
        "args" in c,
    )


def pod_set(
    name: str,
    count: int,
    pod: Mapping[str, Any],
    path: str,
    scale: tuple[tuple[str, ...], int, int | None] = ((), 1, None),
) -> PodSetView:
    """Read one pod template spec found at JSON Pointer ``path``; ``scale`` = (count pointers,
    pods per unit, stated maximum units)."""
    containers = tuple(
        [
            _container(_map(c), f"{path}/containers/{i}")
            for i, c in enumerate(_list(pod.get("containers")))
        ]
    )
    return PodSetView(  # positional, in field order (see _container)
        name,
        max(0, count),
        sum([c.gpus for c in containers]),
        _products(pod),
        containers,
        _cm_volumes(pod),
        *scale,
    )


def _pytorchjob(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    spec = _map(obj.get("spec"))
    specs = _map(spec.get("pytorchReplicaSpecs"))
    if not specs:
        notes.append("spec.pytorchReplicaSpecs is missing")
    elastic = _int(_map(spec.get("elasticPolicy")).get("maxReplicas"), 0)
    out = []
    for rtype, raw in specs.items():
        rspec = _map(raw)
        base = f"/spec/pytorchReplicaSpecs/{escape(str(rtype))}"
        pod = _map(_map(rspec.get("template")).get("spec"))
        scale = ((f"{base}/replicas",), 1, elastic or None) if rtype == "Worker" else ((), 1, None)
        out.append(
            pod_set(str(rtype), _int(rspec.get("replicas"), 1), pod, f"{base}/template/spec", scale)
        )
    return out


def _jobset(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    out = []
    for i, raw in enumerate(_list(_map(obj.get("spec")).get("replicatedJobs"))):
        rj = _map(raw)
        jspec = _map(_map(rj.get("template")).get("spec"))
        step = _int(jspec.get("parallelism"), 1)
        count = _int(rj.get("replicas"), 1) * step
        pod = _map(_map(jspec.get("template")).get("spec"))
        path = f"/spec/replicatedJobs/{i}/template/spec/template/spec"
        scale = ((f"/spec/replicatedJobs/{i}/replicas",), max(1, step), None)
        out.append(pod_set(str(rj.get("name", i)), count, pod, path, scale))
    if not out:
        notes.append("spec.replicatedJobs is empty")
    return out


def _job(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    spec = _map(obj.get("spec"))
    pod = _map(_map(spec.get("template")).get("spec"))
    parallelism = _int(spec.get("parallelism"), 1)
    paths: tuple[str, ...] = ("/spec/parallelism",)
    if _int(spec.get("completions"), -1) == parallelism:
        paths += ("/spec/completions",)
    return [pod_set("job", parallelism, pod, "/spec/template/spec", (paths, 1, None))]


def _pod(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    return [pod_set("pod", 1, _map(obj.get("spec")), "/spec")]


def is_controlled(obj: Mapping[str, Any]) -> bool:
    """A pod created by a controller (judged at its owner, not here)."""
    refs = _list(_map(obj.get("metadata")).get("ownerReferences"))
    return any(_map(r).get("controller") is True for r in refs)


def _trainjob(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    from dssup.admission.trainjob import trainjob_pod_sets

    return trainjob_pod_sets(obj, ns, cache, notes)


SUPPORTED: dict[str, Reader] = {
    "PyTorchJob": _pytorchjob,
    "TrainJob": _trainjob,
    "JobSet": _jobset,
    "Job": _job,
    "Pod": _pod,
}


def normalise(obj: Mapping[str, Any], cache: ClusterCache, namespace: str = "") -> JobView:
    """The ``JobView`` of any supported object; unknown kinds give a view with no pod sets."""
    meta = _map(obj.get("metadata"))
    kind = str(obj.get("kind", ""))
    ns = str(meta.get("namespace") or namespace)
    notes: list[str] = []
    reader = SUPPORTED.get(kind)
    sets = reader(obj, ns, cache, notes) if reader else []
    if reader is None:
        notes.append(f"kind {kind or '<none>'} is not one dssup reads")
    raw_ann = meta.get("annotations")
    annotations = {str(k): str(v) for k, v in _map(raw_ann).items()}
    return JobView(  # positional, in field order (see _container)
        kind,
        ns,
        str(meta.get("name") or meta.get("generateName") or ""),
        annotations,
        isinstance(raw_ann, Mapping),
        tuple(sets),
        tuple(notes),
    )
