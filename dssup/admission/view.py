"""One kind-agnostic view of a training job: pod sets with counts, GPUs and containers.

PyTorchJob, TrainJob, JobSet, batch Job and bare Pods describe the same thing differently; the
policy only ever sees this view (the shape Kueue calls a pod set). Every list the webhook may
patch carries the JSON Pointer where it lives in the admitted object, or ``None`` together with
the pointer where it *would* be added (a TrainJob inheriting its args from the runtime).

Every view is an immutable NamedTuple: evaluations holding them are remembered and shared
between requests, and several are built per review, where a frozen dataclass costs about three
times as much to construct.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["ContainerView", "EnvVar", "JobView", "PodSetView", "annotation_ref", "escape"]

_ANNOTATION_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")


def annotation_ref(field_path: str | None) -> str | None:
    """The annotation a downward-API ``fieldRef`` path reads, if it reads one."""
    m = _ANNOTATION_REF.match(field_path) if field_path else None
    return m.group(1) if m else None


def escape(token: str) -> str:
    """RFC 6901 escaping of one JSON Pointer reference token."""
    return token.replace("~", "~0").replace("/", "~1")


class EnvVar(NamedTuple):
    """One ``env`` entry: a literal value or a ConfigMap key reference."""

    name: str
    value: str | None
    config_map: tuple[str, str] | None = None  # (name, key) of valueFrom.configMapKeyRef
    position: int = -1  # index in the env list of the admitted object; -1 = inherited
    field_ref: str | None = None  # valueFrom.fieldRef.fieldPath (the downward API)


class ContainerView(NamedTuple):
    """A container as the training launcher sees it."""

    name: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[EnvVar, ...]
    gpus: int
    mounts: tuple[tuple[str, str], ...]  # (volume name, mountPath)
    command_path: str  # pointer of ``command`` in the admitted object
    args_path: str  # pointer of ``args`` in the admitted object
    env_path: str
    command_present: bool = True
    args_present: bool = True
    launcher: bool = False  # starts the job without GPUs of its own (an MPIJob launcher)


class PodSetView(NamedTuple):
    """``pods`` identical pods, each with ``gpus_per_pod`` GPUs of ``gpu_products``."""

    name: str
    pods: int
    gpus_per_pod: int
    gpu_products: tuple[str, ...]
    containers: tuple[ContainerView, ...]
    config_map_volumes: Mapping[str, tuple[str, Mapping[str, str]]]  # volume -> (cm, key->path)
    scale_paths: tuple[str, ...] = ()  # pointers that hold the unit count (replicas, parallelism)
    scale_step: int = 1  # pods per unit (JobSet: parallelism of the replicated job)
    max_units: int | None = None  # a limit the job itself states (PyTorchJob elasticPolicy)
    annotations: Mapping[str, str] = {}  # the pod template's own (they reach the pods)
    meta_path: str = ""  # pointer of the template's metadata ("" when it cannot be patched)
    annotations_present: bool = False
    downward: frozenset[str] = frozenset()  # template annotations the pods read (downward API)
    memory_limit_bytes: int | None = None  # the GPU containers' memory limit (None: not stated)

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


class JobView(NamedTuple):
    """The normalised job. ``notes`` explains anything that could not be read."""

    kind: str
    namespace: str
    name: str
    annotations: Mapping[str, str]
    annotations_present: bool
    pod_sets: tuple[PodSetView, ...]
    notes: tuple[str, ...] = ()
    api_version: str = ""
    model_refs: tuple[tuple[str, str], ...] = ()  # (where, reference) the kind itself states

    @property
    def world_size(self) -> int:
        return sum(ps.gpus for ps in self.pod_sets)

    @property
    def training_sets(self) -> tuple[PodSetView, ...]:
        return tuple(ps for ps in self.pod_sets if ps.gpus_per_pod > 0 and ps.pods > 0)
