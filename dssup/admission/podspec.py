"""Reading pod templates, shared by every kind's reader (``dssup/admission/kinds/``).

Readers never raise on odd input: a missing or mistyped field yields an empty value, so a
strange object is answered (allowed, with a warning) instead of crashing the webhook. Numbers
are read as ASCII digits only (``'²'.isdigit()`` is true in Python, ``int('²')`` fails), and a
count that is not a number (an unrendered ``$NUM_NODES`` template) is reported by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from dssup.admission import gpuid
from dssup.admission.cache import ClusterCache
from dssup.admission.view import ContainerView, EnvVar, PodSetView

__all__ = [
    "as_int",
    "as_list",
    "as_map",
    "container",
    "digits",
    "env",
    "memory_bytes",
    "memory_limit",
    "pod_set",
    "strs",
]

_EMPTY: Mapping[str, Any] = {}
_SCALARS = frozenset({str, int, float, bool, list, type(None)})
_STR_ONLY = frozenset({str})


def as_map(value: Any) -> Mapping[str, Any]:
    kind = type(value)
    if kind is dict:  # the common case, without the (slow) ABC check
        return value  # type: ignore[no-any-return]
    if kind in _SCALARS:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def digits(text: str) -> bool:
    """ASCII digits only: what ``int`` and Kubernetes quantities accept."""
    return text.isascii() and text.isdigit()


def as_int(value: Any, default: int) -> int:
    if value is None:  # the common case for optional counts
        return default
    if type(value) is int:  # a JSON integer (not a bool: type, not isinstance)
        return value
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and digits(value.strip()):
        return int(value)
    return default


def strs(value: Any) -> tuple[str, ...]:
    items = as_list(value)
    if set(map(type, items)) <= _STR_ONLY:  # the common case: a list of strings
        return tuple(items)
    return tuple(
        str(v) for v in items if isinstance(v, (str, int, float)) and not isinstance(v, bool)
    )


_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(
    r"^([0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})"
    r"(?:([eE][+-]?[0-9]{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m))?$"
)


def memory_bytes(value: Any) -> int | None:
    """Bytes of a Kubernetes memory quantity (``16Gi``, ``16G``, ``1.5e10``, ``17179869184``);
    None when absent or unreadable (the caller reports it)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return None
    number, exp, suffix = match.groups()
    try:
        amount = Decimal(number) * (Decimal(10) ** int(exp[1:]) if exp else 1)
    except InvalidOperation:
        return None
    if suffix == "m":
        amount /= 1000
    elif suffix:
        amount *= _BINARY.get(suffix) or _DECIMAL[suffix]
    bytes_ = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    return bytes_ if bytes_ < 1 << 70 else None


def memory_limit(containers: Any) -> int | None:
    """The memory limit of the containers that request GPUs (the training processes' cgroup):
    their ``resources.limits.memory`` summed; None when one of them states none (the node's
    memory is then the bound) or when no container requests GPUs."""
    total, seen = 0, False
    for raw in as_list(containers):
        c = as_map(raw)
        if gpuid.container_gpus(c, [])[0] <= 0:
            continue
        limits = as_map(as_map(c.get("resources")).get("limits"))
        found = memory_bytes(limits.get("memory"))
        if found is None:
            return None
        total, seen = total + found, True
    return total if seen else None


def _config_map_ref(value_from: Any) -> tuple[str, str] | None:
    ref = as_map(as_map(value_from).get("configMapKeyRef"))
    return (str(ref.get("name", "")), str(ref.get("key", ""))) if ref else None


def _field_ref(value_from: Any) -> str | None:
    ref = as_map(as_map(value_from).get("fieldRef"))
    path = ref.get("fieldPath")
    return path if isinstance(path, str) else None


def env(items: Any) -> tuple[EnvVar, ...]:
    out = []
    for i, raw in enumerate(as_list(items)):
        item = as_map(raw)
        name = item.get("name")
        if not isinstance(name, str):
            continue
        value_from = item.get("valueFrom")  # usually absent: a literal value
        cm = None if value_from is None else _config_map_ref(value_from)
        field = None if value_from is None else _field_ref(value_from)
        value = item.get("value")
        text = str(value) if value is not None and not isinstance(value, (dict, list)) else None
        out.append(EnvVar(name, text, cm, i, field))
    return tuple(out)


def container(c: Mapping[str, Any], path: str, notes: list[str]) -> ContainerView:
    raw_mounts = c.get("volumeMounts")
    mounts = (
        tuple(
            [
                (str(as_map(m).get("name", "")), str(as_map(m).get("mountPath", "")))
                for m in as_list(raw_mounts)
            ]
        )
        if raw_mounts
        else ()
    )
    gpus, _ = gpuid.container_gpus(c, notes)
    # Positional: a NamedTuple built from keywords costs about 2.5 times as much, and several
    # views are built per review. The order is ContainerView's field order.
    return ContainerView(
        str(c.get("name", "")),
        strs(c.get("command")),
        strs(c.get("args")),
        env(c.get("env")),
        gpus,
        mounts,
        f"{path}/command",
        f"{path}/args",
        f"{path}/env",
        "command" in c,
        "args" in c,
    )


def _cm_volumes(pod: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, str]]]:
    out: dict[str, tuple[str, Mapping[str, str]]] = {}
    for raw_vol in as_list(pod.get("volumes")):
        vol = as_map(raw_vol)
        cm = as_map(vol.get("configMap"))
        if isinstance(vol.get("name"), str) and isinstance(cm.get("name"), str):
            items = {
                str(as_map(i).get("key")): str(as_map(i).get("path"))
                for i in as_list(cm.get("items"))
            }
            out[vol["name"]] = (cm["name"], items)
    return out


def pod_set(
    name: str,
    count: int,
    pod: Mapping[str, Any],
    path: str,
    cache: ClusterCache,
    notes: list[str],
    scale: tuple[tuple[str, ...], int, int | None] = ((), 1, None),
    template_meta: Mapping[str, Any] | None = None,
) -> PodSetView:
    """Read one pod template spec found at JSON Pointer ``path``; ``scale`` = (count pointers,
    pods per unit, stated maximum units); ``template_meta``: the template's metadata (its
    annotations reach the pods, unlike the job's)."""
    containers = tuple(
        [
            container(as_map(c), f"{path}/containers/{i}", notes)
            for i, c in enumerate(as_list(pod.get("containers")))
        ]
    )
    gpu_containers = [as_map(c) for c in as_list(pod.get("containers"))]
    products = gpuid.products(pod, gpu_containers, cache, notes)
    meta = as_map(template_meta)
    raw_ann = meta.get("annotations")
    annotations = {str(k): str(v) for k, v in as_map(raw_ann).items()}
    return PodSetView(  # positional, in field order (see container)
        name,
        max(0, count),
        sum([c.gpus for c in containers]),
        products,
        containers,
        _cm_volumes(pod),
        *scale,
        annotations,
        path.rsplit("/spec", 1)[0] + "/metadata" if path.endswith("/spec") else "",
        isinstance(raw_ann, Mapping),
        gpuid.downward_annotations(pod),
        memory_limit(pod.get("containers")),
    )
