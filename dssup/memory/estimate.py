"""Assemble the per-stage, per-term device memory of a training config (spec section 8).

    forward/backward peak = W + G + O + in_flight * activations + ZeRO-3 working set + buffers
                            (eager profile: or its end-of-backward term, if higher)
    optimizer-step peak   = W + G + O + optimizer transients (no activations)
    device total          = max(both) * (1 + fragmentation) + CUDA context + calibration

Every stage is estimated; the worst one is the peak. The phase of the peak is reported because
the right remedy depends on it (a smaller micro-batch does not fix an optimizer-step peak).
"""

from __future__ import annotations

import math

from dssup.memory.activations import keep
from dssup.memory.assumptions import assumptions
from dssup.memory.config import Convention, Layout, Overheads, Training
from dssup.memory.core import (
    PreparedStage,
    activations,
    device_split,
    end_of_backward,
    finish,
    in_flight,
    prepare,
    states,
)
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.params import model_total
from dssup.memory.result import Estimate, ParamCounts, StageBytes, StageEstimate
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import check_profile, traced_stage, without_untraced_mtp
from dssup.memory.validate import validate

__all__ = ["estimate"]


def _stage(
    st: PreparedStage, layout: Layout, t: Training, conv: Convention, r: Resolved, ov: Overheads
) -> StageEstimate:
    s = states(st, layout, t, conv, r, ov)
    count, factor = in_flight(layout, st.index, t.grad_accum)
    per_mb, acts = activations(st.acts[t.recompute], t.micro_batch, count, factor)
    fb = s.static + acts + s.working_set + r.comm_buffer_bytes
    tail = end_of_backward(st, s, t, r.comm_buffer_bytes)
    if tail is not None:  # eager: the end of backward can top the start (optimizer offloaded)
        fb = max(fb, tail)
    opt = s.static + s.transient
    if isinstance(t.implementation, TracedProfile):  # the user's own step, replayed
        sp = st.params
        ts = traced_stage(
            t.implementation, layout, t, sp.dense_layers, sp.moe_layers, sp.first, sp.last,
            s.ms.gradients,
        )  # fmt: skip
        per_mb = ts.forward_backward(t.micro_batch, 1)[0]
        acts = ts.forward_backward(t.micro_batch, math.ceil(count * factor))[0]
        fb = s.static + acts + s.working_set + r.comm_buffer_bytes
        opt += ts.batch(t.micro_batch)
    frag, total = finish(max(fb, opt), r, ov)
    b = t.micro_batch
    sbytes = StageBytes(
        weights=s.ms.weights,
        gradients=s.ms.gradients,
        optimizer=s.ms.optimizer,
        activations=acts,
        activations_per_micro_batch=per_mb,
        in_flight_micro_batches=count,
        in_flight_factor=factor,
        zero3_working_set=s.working_set,
        buffers=r.comm_buffer_bytes,
        optimizer_transient=s.transient,
        calibration=ov.calibration_bytes,
        fragmentation=frag,
        cuda_context=r.cuda_context_bytes,
        total=total,
    )
    split = device_split(st, layout)
    return StageEstimate(
        stage=st.index,
        layers=list(st.layers),
        params=ParamCounts(total=split.total, moe=split.moe, non_moe=split.non_moe),
        bytes=sbytes,
        host_bytes=s.host,
        activation_terms={x.name: x.bytes * b for x in st.terms if keep(x.group, t.recompute)},
        phase="forward-backward" if fb >= opt else "optimizer-step",
    )


def estimate(
    model: ModelSpec,
    layout: Layout,
    training: Training,
    overheads: Overheads | None = None,
    convention: Convention = "megatron",
    gpu_memory_bytes: int | None = None,
) -> Estimate:
    """Per-GPU memory of every pipeline stage; the peak stage; whether it fits."""
    validate(model, layout, training)
    notes: list[str] = []
    if isinstance(training.implementation, TracedProfile):
        model, notes = without_untraced_mtp(model, training.implementation)
        check_profile(training.implementation, model_total(model, "megatron"), training.recompute)
    ov = overheads or Overheads()
    r = resolve(convention, training, ov)
    prepared = prepare(model, layout, training, convention, r)
    stages = [_stage(st, layout, training, convention, r, ov) for st in prepared]
    peak = max(range(len(stages)), key=lambda i: stages[i].bytes.total)
    peak_bytes = stages[peak].bytes.total
    return Estimate(
        convention=convention,
        model=model.name,
        world_size=layout.world_size,
        stages=stages,
        peak_stage=peak,
        peak_bytes=peak_bytes,
        peak_phase=stages[peak].phase,
        gpu_memory_bytes=gpu_memory_bytes,
        fits=None if gpu_memory_bytes is None else peak_bytes <= gpu_memory_bytes,
        headroom_bytes=None if gpu_memory_bytes is None else gpu_memory_bytes - peak_bytes,
        assumptions=notes + assumptions(model, layout, training, convention, r),
    )
