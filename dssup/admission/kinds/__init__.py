"""Normalise every kind dssup reads into one ``JobView``, matched by group, version and kind.

One module per kind, each knowing only where its kind keeps pod templates, counts and its own
statements (a TrainJob's runtime and model initializer, an MPIJob's launcher); pod templates
are read by ``dssup.admission.podspec``. A kind is recognised by its API group *and* kind
(a Volcano ``batch.volcano.sh`` Job is not a ``batch`` Job), and only at versions whose shape
dssup knows; anything else is answered ``unsupported-kind``, naming the apiVersion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.kinds import batch, jobset, mpijob, pytorchjob, trainjob, volcano
from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_list, as_map
from dssup.admission.view import JobView

__all__ = ["KINDS", "SUPPORTED", "identify", "is_controlled", "normalise", "suspended"]

KINDS: tuple[KindReader, ...] = (
    pytorchjob.READER,
    trainjob.READER,
    jobset.READER,
    batch.JOB,
    batch.POD,
    volcano.READER,
    mpijob.READER,
)
_BY_GK: dict[tuple[str, str], KindReader] = {(k.group, k.kind): k for k in KINDS}
SUPPORTED = frozenset(k.kind for k in KINDS)  # kind names (for messages and dssup admit)


def identify(obj: Mapping[str, Any]) -> tuple[KindReader | None, str]:
    """The reader of ``obj`` and, when there is none, why (naming apiVersion and kind)."""
    kind, api = obj.get("kind"), obj.get("apiVersion")
    if not isinstance(kind, str) or not kind:
        return None, f"kind {kind!r} is not a kind name"
    if not isinstance(api, str):
        return None, f"{kind} has no apiVersion string ({api!r})"
    group, _, version = api.rpartition("/")
    reader = _BY_GK.get((group, kind))
    if reader is None:
        return None, f"kind {api} {kind} is not one dssup reads"
    if version not in reader.versions:
        return None, (
            f"{kind} {api} is not a version dssup reads (reads {', '.join(reader.versions)})"
        )
    return reader, ""


def is_controlled(obj: Mapping[str, Any]) -> bool:
    """A pod or Job created by a controller (judged at its owner, not here)."""
    refs = as_list(as_map(obj.get("metadata")).get("ownerReferences"))
    return any(as_map(r).get("controller") is True for r in refs)


def suspended(obj: Mapping[str, Any]) -> bool:
    """Whether the job is suspended (Kueue creates jobs suspended and unsuspends them)."""
    reader, _ = identify(obj)
    return reader is not None and reader.suspended(obj)


def normalise(obj: Mapping[str, Any], cache: ClusterCache, namespace: str = "") -> JobView:
    """The ``JobView`` of any object; an unsupported one gives a view with no pod sets."""
    meta = as_map(obj.get("metadata"))
    ns = str(meta.get("namespace") or namespace)
    ctx = Context(cache, ns, [], [])
    reader, why = identify(obj)
    sets = reader.read(obj, ctx) if reader is not None else []
    if reader is None:
        ctx.notes.append(why)
    raw_ann = meta.get("annotations")
    annotations = {str(k): str(v) for k, v in as_map(raw_ann).items()}
    api = obj.get("apiVersion")
    return JobView(  # positional, in field order
        str(obj.get("kind", "")),
        ns,
        str(meta.get("name") or meta.get("generateName") or ""),
        annotations,
        isinstance(raw_ann, Mapping),
        tuple(sets),
        tuple(ctx.notes),
        api if isinstance(api, str) else "",
        tuple(ctx.model_refs),
    )
