"""The config as the pods see it: the object without the job-level knob annotations.

PyTorchJob, JobSet, Job, TrainJob, Volcano and MPIJob annotations are not copied to pods, so a
knob stated only there is the job's word, not something the containers read. A bare Pod's
annotations are its own; those its containers read through the downward API stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.config import JobConfig, resolve
from dssup.admission.gpuid import downward_annotations
from dssup.admission.kinds import normalise
from dssup.admission.patch import KNOB_ANNOTATIONS
from dssup.admission.source import read_sources
from dssup.admission.wire import copy_json

__all__ = ["pods_config", "pods_view", "seen_knobs"]


def pods_view(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (changed in place) without the job-level knob annotations the pods cannot see."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict):
        return obj
    keep: frozenset[str] = frozenset()
    if obj.get("kind") == "Pod":
        spec = obj.get("spec")
        keep = downward_annotations(spec if isinstance(spec, dict) else {})
    for key in KNOB_ANNOTATIONS:
        if key not in keep and "*" not in keep:
            annotations.pop(key, None)
    return obj


def pods_config(obj: Mapping[str, Any], cache: ClusterCache, namespace: str) -> JobConfig:
    """Resolve the config the pods see (raises like ``resolve``)."""
    view = normalise(pods_view(copy_json(obj)), cache, namespace)
    return resolve(read_sources(view, cache), cache, view.world_size)


def _value(cfg: JobConfig, knob: str) -> Any:
    return cfg.global_batch if knob == "global_batch" else getattr(cfg.training, knob)


def seen_knobs(full: JobConfig, seen: JobConfig) -> frozenset[str]:
    """Knobs the pods' view states itself (not a default) with the value ``full`` has."""
    return frozenset(
        k
        for k in ("micro_batch", "global_batch", "seq_len", "recompute", "zero_stage")
        if seen.origins.get(k) not in (None, "default", "derived")
        and _value(seen, k) == _value(full, k)
    )
