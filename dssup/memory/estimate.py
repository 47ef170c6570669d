"""Assemble the per-device, per-term memory of a training config (spec section 8).

    forward/backward peak = W + G + O + in-flight activations + backward working set
                            + ZeRO-3 working set + buffers
                            (eager profile: or its end-of-backward term, if higher)
    optimizer-step peak   = W + G + O + optimizer transients (no activations)
    device total          = max(both) * (1 + fragmentation) + CUDA context + calibration

A row is a device (pipeline rank) with the stages it holds (``stages.placement``); its in-flight
activations are those of each held stage at the device's peak (``schedule.py``). Every device
is estimated; the worst one is the peak. The phase of the peak is reported because the right
remedy depends on it (a smaller micro-batch does not fix an optimizer-step peak).
"""

from __future__ import annotations

from functools import lru_cache

from dssup.errors import ConfigError
from dssup.memory.assumptions import assumptions
from dssup.memory.capacity import band, near_limit
from dssup.memory.config import Convention, Layout, Overheads, Training
from dssup.memory.core import (
    PreparedDevice,
    constant,
    device_in_flight,
    finish,
    prepare,
    states,
    tails,
)
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.params import Split, model_total
from dssup.memory.result import (
    Estimate,
    HeldStage,
    Inputs,
    ParamCounts,
    StageBytes,
    StageEstimate,
)
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_device import traced_device, traced_in_flight
from dssup.memory.traced_stage import check_profile, without_untraced_mtp
from dssup.memory.validate import validate

__all__ = ["estimate"]


@lru_cache(maxsize=4096)
def _params(split: Split) -> ParamCounts:
    """(Cached: the result models are immutable and shared between estimates.)"""
    return ParamCounts(total=split.total, moe=split.moe, non_moe=split.non_moe)


def _held(dev: PreparedDevice, counts: tuple[int, ...], t: Training) -> list[HeldStage]:
    out = []
    for st, n in zip(dev.stages, counts, strict=True):
        out.append(
            HeldStage(
                stage=st.index,
                layers=list(st.layers),
                params=_params(st.params.split),
                embedding=st.params.first,
                head=st.params.last,
                activations_per_micro_batch=st.acts[t.recompute] * t.micro_batch,
                in_flight_micro_batches=n,
            )
        )
    return out


def _terms(dev: PreparedDevice, t: Training) -> dict[str, int]:
    b = t.micro_batch
    if len(dev.stages) == 1:  # names are unique within a stage
        return {x.name: x.bytes * b for x in dev.stages[0].terms[t.recompute]}
    out: dict[str, int] = {}
    for st in dev.stages:
        for x in st.terms[t.recompute]:
            out[x.name] = out.get(x.name, 0) + x.bytes * t.micro_batch
    return out


def _device(
    dev: PreparedDevice, layout: Layout, t: Training, conv: Convention, r: Resolved, ov: Overheads
) -> StageEstimate:
    s = states(dev, layout, t, conv, r, ov)
    b, rc = t.micro_batch, t.recompute
    per_sample, counts = device_in_flight(dev, layout, rc, t.grad_accum)
    acts, work = per_sample * b, dev.work(rc) * b
    const = constant(dev, rc)
    fb = s.static + acts + work + s.working_set + const + r.comm_buffer_bytes
    for later, per in tails(dev, s, t, r, rc):  # later moments of the backward
        fb = max(fb, later + per * b)
    opt = s.static + s.transient
    if isinstance(t.implementation, TracedProfile):  # the user's own step, replayed
        ts = traced_device(t.implementation, dev, layout, t, s.ms.gradients)
        n = traced_in_flight(dev, layout, rc, t.grad_accum)
        acts, work, const = ts.forward_backward(b, n)[0], 0, 0
        fb = s.static + acts + s.working_set + r.comm_buffer_bytes
        opt += ts.batch(b)
    frag, total = finish(max(fb, opt), r, ov)
    sbytes = StageBytes(
        weights=s.ms.weights,
        gradients=s.ms.gradients,
        optimizer=s.ms.optimizer,
        activations=acts,
        activations_per_micro_batch=sum(st.acts[rc] for st in dev.stages) * b,
        in_flight_micro_batches=sum(counts),
        in_flight_factor=1.0,
        zero3_working_set=s.working_set,
        buffers=r.comm_buffer_bytes,
        backward_working_set=work,
        activation_constant=const,
        optimizer_transient=s.transient,
        calibration=ov.calibration_bytes,
        fragmentation=frag,
        cuda_context=r.cuda_context_bytes,
        total=total,
    )
    return StageEstimate(
        stage=dev.index,
        layers=dev.layers,
        params=_params(dev.split),
        bytes=sbytes,
        host_bytes=s.host,
        host_init_bytes=s.host_init,
        host_terms=dict(s.host_terms),
        activation_terms=_terms(dev, t),
        phase="forward-backward" if fb >= opt else "optimizer-step",
        held=_held(dev, counts, t),
    )


def estimate(
    model: ModelSpec,
    layout: Layout,
    training: Training,
    overheads: Overheads | None = None,
    convention: Convention = "megatron",
    gpu_memory_bytes: int | None = None,
    host_memory_bytes: int | None = None,
    gpus_per_node: int | None = None,
) -> Estimate:
    """Per-GPU memory of every pipeline rank; the peak rank; whether it fits the GPU and, with
    ``host_memory_bytes`` (per node, ``gpus_per_node`` GPUs sharing it), the host."""
    notes: list[str] = []
    if isinstance(training.implementation, TracedProfile):
        model, notes = without_untraced_mtp(model, training.implementation)
        check_profile(training.implementation, model_total(model, "megatron"), training.recompute)
    ov = overheads or Overheads()
    r = resolve(convention, training, ov)
    validate(model, layout, training, r)
    _check_host(host_memory_bytes, gpus_per_node)
    devices = prepare(model, layout, training, convention, r)
    rows = [_device(d, layout, training, convention, r, ov) for d in devices]
    peak = max(range(len(rows)), key=lambda i: rows[i].bytes.total)
    peak_bytes = rows[peak].bytes.total
    per_node = None
    if gpus_per_node is not None:
        per_node = gpus_per_node * max(max(st.host_bytes, st.host_init_bytes) for st in rows)
    gpu_fits = None if gpu_memory_bytes is None else peak_bytes <= gpu_memory_bytes
    host_fits = None
    if host_memory_bytes is not None and per_node is not None:
        host_fits = per_node <= host_memory_bytes
    checks = [c for c in (gpu_fits, host_fits) if c is not None]
    unc = band(
        r.framework if convention != "paper" else None,
        isinstance(training.implementation, TracedProfile),
    )
    near = None
    if gpu_memory_bytes is not None:
        near = bool(gpu_fits) and near_limit(peak_bytes, gpu_memory_bytes, unc)
    return Estimate(
        convention=convention,
        model=model.name,
        world_size=layout.world_size,
        stages=rows,
        peak_stage=peak,
        peak_bytes=peak_bytes,
        peak_phase=rows[peak].phase,
        gpu_memory_bytes=gpu_memory_bytes,
        fits=all(checks) if checks else None,
        headroom_bytes=None if gpu_memory_bytes is None else gpu_memory_bytes - peak_bytes,
        near_limit=near,
        uncertainty=unc.fraction,
        uncertainty_source=unc.source,
        assumptions=notes + assumptions(model, layout, training, convention, r, ov, gpus_per_node),
        schedule=layout.schedule,
        framework=None if convention == "paper" else r.framework,
        gpus_per_node=gpus_per_node,
        host_bytes_per_node=per_node,
        host_memory_bytes=host_memory_bytes,
        host_fits=host_fits,
        host_headroom_bytes=_headroom(host_memory_bytes, per_node),
        inputs=_inputs(model, layout, training, r, convention),
    )


@lru_cache(maxsize=64)
def _total(m: ModelSpec, conv: Convention) -> int:
    return model_total(m, conv)


def _inputs(m: ModelSpec, layout: Layout, t: Training, r: Resolved, conv: Convention) -> Inputs:
    p = r.precision
    offload = {(True, True): "both", (True, False): "optimizer", (False, True): "params"}
    return Inputs(
        parameters=_total(m, conv),
        layout=layout,
        micro_batch=t.micro_batch,
        seq_len=t.seq_len,
        grad_accum=t.grad_accum,
        global_batch=t.micro_batch * t.grad_accum * layout.dp,
        recompute=t.recompute,
        zero_stage=t.zero_stage,
        offload=offload.get((t.offload_optimizer, t.offload_params), "none"),
        bytes_per_parameter={
            "weights": p.weights,
            "gradients": p.gradients,
            "master": p.master,
            "moments": p.moments,
            "activations": p.activations,
        },
        calibrated=t.implementation is not None,
    )


def _headroom(limit: int | None, need: int | None) -> int | None:
    return None if limit is None or need is None else limit - need


def _check_host(host_memory_bytes: int | None, gpus_per_node: int | None) -> None:
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ConfigError("gpus_per_node", f"{gpus_per_node} GPUs per node", "give 1 or more")
    if host_memory_bytes is not None and gpus_per_node is None:
        raise ConfigError(
            "gpus_per_node", "needed to check host memory per node", "give the GPUs per node"
        )
