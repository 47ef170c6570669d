"""Kubeflow Trainer ``TrainJob`` (trainer.kubeflow.org/v1alpha1): the job plus its runtime.

A TrainJob holds only overrides (``spec.trainer``: numNodes, resourcesPerNode, command, args,
env); the pod template, node selection and defaults live in the referenced
``ClusterTrainingRuntime`` or ``TrainingRuntime``, read from the watch cache. The trainer is the
replicated job ``node`` whose container is ``node``. Args inherited from the runtime are patched
by adding ``/spec/trainer/args`` (a TrainJob override), never by touching the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.cache import ClusterCache
from dssup.admission.kinds import GPU_RESOURCE, _env, _int, _list, _map, _strs, pod_set
from dssup.admission.view import ContainerView, PodSetView

__all__ = ["TRAINER_NAME", "trainjob_pod_sets"]

TRAINER_NAME = "node"


def _runtime_pod(runtime: Mapping[str, Any]) -> tuple[Mapping[str, Any], int]:
    spec = _map(runtime.get("spec"))
    for raw_rj in _list(_map(_map(spec.get("template")).get("spec")).get("replicatedJobs")):
        rj = _map(raw_rj)
        if rj.get("name") == TRAINER_NAME:
            pod = _map(_map(_map(_map(rj.get("template")).get("spec")).get("template")).get("spec"))
            return pod, _int(_map(spec.get("mlPolicy")).get("numNodes"), 1)
    return {}, _int(_map(spec.get("mlPolicy")).get("numNodes"), 1)


def _overrides(spec: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """Apply v2.1 ``podTemplateOverrides`` targeting ``node`` (node selection only)."""
    merged = dict(pod)
    for raw_item in _list(spec.get("podTemplateOverrides")):
        item = _map(raw_item)
        targets = {_map(t).get("name") for t in _list(item.get("targetJobs"))}
        if TRAINER_NAME in targets:
            ospec = _map(item.get("spec"))
            for key in ("nodeSelector", "affinity"):
                if key in ospec:
                    merged[key] = ospec[key]
    return merged


def _trainer_container(base: ContainerView | None, trainer: Mapping[str, Any]) -> ContainerView:
    res = _map(trainer.get("resourcesPerNode"))
    limit = _int(_map(res.get("limits")).get(GPU_RESOURCE), -1)
    if limit < 0:
        limit = _int(_map(res.get("requests")).get(GPU_RESOURCE), -1)
    own_env = _env(trainer.get("env"))
    own_names = {e.name for e in own_env}
    inherited = tuple(
        type(e)(e.name, e.value, e.config_map, -1)
        for e in (base.env if base else ())
        if e.name not in own_names
    )
    return ContainerView(
        name=TRAINER_NAME,
        command=_strs(trainer["command"])
        if "command" in trainer
        else (base.command if base else ()),
        args=_strs(trainer["args"]) if "args" in trainer else (base.args if base else ()),
        env=own_env + inherited,
        gpus=limit if limit >= 0 else (base.gpus if base else 0),
        mounts=base.mounts if base else (),
        command_path="/spec/trainer/command",
        args_path="/spec/trainer/args",
        env_path="/spec/trainer/env",
        command_present="command" in trainer,
        args_present="args" in trainer,
    )


def trainjob_pod_sets(
    obj: Mapping[str, Any], ns: str, cache: ClusterCache, notes: list[str]
) -> list[PodSetView]:
    spec = _map(obj.get("spec"))
    ref = _map(spec.get("runtimeRef"))
    kind = str(ref.get("kind") or "ClusterTrainingRuntime")
    name = str(ref.get("name") or "")
    runtime = cache.training_runtime(ns, kind, name) if name else None
    if runtime is None:
        notes.append(f"cache miss: {kind} {name or '<unnamed>'} not in the runtime cache")
    pod, runtime_nodes = _runtime_pod(runtime or {})
    pod = _overrides(spec, pod)
    base_set = pod_set(TRAINER_NAME, 1, pod, "/runtime")
    base = next((c for c in base_set.containers if c.name == TRAINER_NAME), None)
    trainer = _map(spec.get("trainer"))
    container = _trainer_container(base, trainer)
    others = tuple(c for c in base_set.containers if c.name != TRAINER_NAME and c.gpus > 0)
    if others:
        notes.append("runtime containers besides 'node' request GPUs; only 'node' is judged")
    if "runtimePatches" in spec:
        notes.append("spec.runtimePatches are not read; node selection comes from the runtime")
    count = _int(trainer.get("numNodes"), runtime_nodes)
    return [
        PodSetView(
            name=TRAINER_NAME,
            pods=max(0, count),
            gpus_per_pod=container.gpus,
            gpu_products=base_set.gpu_products,
            containers=(container,),
            config_map_volumes=base_set.config_map_volumes,
            scale_paths=("/spec/trainer/numNodes",),
        )
    ]
