"""Kubeflow Trainer ``TrainJob`` (trainer.kubeflow.org/v1alpha1): the job plus its runtime.

A TrainJob holds only overrides (``spec.trainer``: numNodes, resourcesPerNode, command, args,
env); the pod template, node selection and defaults live in the referenced
``ClusterTrainingRuntime`` or ``TrainingRuntime``, read from the watch cache. The trainer is the
replicated job ``node`` whose container is ``node``. Node selection may be changed per job by
``podSpecOverrides`` (Trainer 2.0), ``podTemplateOverrides`` (2.1) and ``runtimePatches``
(2.2+), applied here in that order. The model comes from ``spec.initializer.model.storageUri``
or the runtime's ``model-initializer`` (``STORAGE_URI=hf://...``). Args inherited from the
runtime are patched by adding ``/spec/trainer/args`` (a TrainJob override), never by touching
the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission import gpuid
from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_list, as_map, env, memory_bytes, pod_set, strs
from dssup.admission.view import ContainerView, PodSetView

__all__ = ["READER", "TRAINER_NAME"]

TRAINER_NAME = "node"
MODEL_INITIALIZER = "model-initializer"
_NODE_KEYS = ("nodeSelector", "affinity")


def _jobs(runtime: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    spec = as_map(as_map(as_map(runtime.get("spec")).get("template")).get("spec"))
    return {str(as_map(rj).get("name")): as_map(rj) for rj in as_list(spec.get("replicatedJobs"))}


def _pod_of(rj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(
        as_map(as_map(as_map(rj.get("template")).get("spec")).get("template")).get("spec")
    )


def _targets(item: Mapping[str, Any]) -> set[Any]:
    return {as_map(t).get("name") for t in as_list(item.get("targetJobs"))}


def _merge(pod: dict[str, Any], override: Mapping[str, Any]) -> None:
    for key in _NODE_KEYS:
        if key in override:
            if key == "nodeSelector":
                pod[key] = {**as_map(pod.get(key)), **as_map(override[key])}
            else:
                pod[key] = override[key]


def _overrides(spec: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """Node selection after podSpecOverrides (2.0), podTemplateOverrides (2.1) and
    runtimePatches (2.2+) that target ``node``."""
    merged = dict(pod)
    for item in map(as_map, as_list(spec.get("podSpecOverrides"))):
        if TRAINER_NAME in _targets(item):
            _merge(merged, item)
    for item in map(as_map, as_list(spec.get("podTemplateOverrides"))):
        if TRAINER_NAME in _targets(item):
            _merge(merged, as_map(item.get("spec")))
    for patch in map(as_map, as_list(spec.get("runtimePatches"))):
        rt_spec = as_map(patch.get("trainingRuntimeSpec"))
        for name, rj in _jobs({"spec": rt_spec}).items():
            if name == TRAINER_NAME:
                _merge(merged, _pod_of(rj))
    return merged


def _trainer_container(base: ContainerView | None, trainer: Mapping[str, Any]) -> ContainerView:
    res = {"name": TRAINER_NAME, "resources": as_map(trainer.get("resourcesPerNode"))}
    own_gpus, counted = gpuid.container_gpus(res, [])
    own_env = env(trainer.get("env"))
    own_names = {e.name for e in own_env}
    inherited = tuple(
        e._replace(position=-1) for e in (base.env if base else ()) if e.name not in own_names
    )
    return ContainerView(
        name=TRAINER_NAME,
        command=strs(trainer["command"])
        if "command" in trainer
        else (base.command if base else ()),
        args=strs(trainer["args"]) if "args" in trainer else (base.args if base else ()),
        env=own_env + inherited,
        gpus=own_gpus if counted else (base.gpus if base else 0),
        mounts=base.mounts if base else (),
        command_path="/spec/trainer/command",
        args_path="/spec/trainer/args",
        env_path="/spec/trainer/env",
        command_present="command" in trainer,
        args_present="args" in trainer,
    )


def _model_refs(
    spec: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any]], ctx: Context
) -> None:
    uri = as_map(as_map(spec.get("initializer")).get("model")).get("storageUri")
    if isinstance(uri, str) and uri:
        ctx.model_refs.append(("spec.initializer.model.storageUri", uri))
        return
    init = jobs.get(MODEL_INITIALIZER)
    for c in as_list(_pod_of(init).get("containers")) if init else ():
        for var in env(as_map(c).get("env")):
            if var.name == "STORAGE_URI" and var.value:
                ctx.model_refs.append((f"runtime {MODEL_INITIALIZER} env STORAGE_URI", var.value))


def _read(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    spec = as_map(obj.get("spec"))
    ref = as_map(spec.get("runtimeRef"))
    kind = str(ref.get("kind") or "ClusterTrainingRuntime")
    name = str(ref.get("name") or "")
    runtime = ctx.cache.training_runtime(ctx.namespace, kind, name) if name else None
    if runtime is None:
        ctx.notes.append(f"cache miss: {kind} {name or '<unnamed>'} not in the runtime cache")
    jobs = _jobs(runtime or {})
    node_job = jobs.get(TRAINER_NAME, {})
    ml_policy = as_map(as_map(as_map(runtime).get("spec")).get("mlPolicy"))
    runtime_nodes = as_int(ml_policy.get("numNodes"), 1)
    pod = _overrides(spec, _pod_of(node_job))
    base_set = pod_set(TRAINER_NAME, 1, pod, "/runtime", ctx.cache, ctx.notes)
    base = next((c for c in base_set.containers if c.name == TRAINER_NAME), None)
    trainer = as_map(spec.get("trainer"))
    container = _trainer_container(base, trainer)
    others = tuple(c for c in base_set.containers if c.name != TRAINER_NAME and c.gpus > 0)
    if others:
        ctx.notes.append("runtime containers besides 'node' request GPUs; only 'node' is judged")
    _model_refs(spec, jobs, ctx)
    count = as_int(trainer.get("numNodes"), runtime_nodes)
    return [
        PodSetView(
            name=TRAINER_NAME,
            pods=max(0, count),
            gpus_per_pod=container.gpus,
            gpu_products=base_set.gpu_products,
            containers=(container,),
            config_map_volumes=base_set.config_map_volumes,
            scale_paths=("/spec/trainer/numNodes",),
            memory_limit_bytes=_trainer_memory(trainer, base_set.memory_limit_bytes),
        )
    ]


def _trainer_memory(trainer: Mapping[str, Any], runtime: int | None) -> int | None:
    """The trainer's ``resourcesPerNode`` memory limit when it states one, else the runtime's."""
    limits = as_map(as_map(trainer.get("resourcesPerNode")).get("limits"))
    stated = memory_bytes(limits.get("memory"))
    return runtime if stated is None else stated


READER = KindReader("trainer.kubeflow.org", ("v1alpha1",), "TrainJob", _read)
