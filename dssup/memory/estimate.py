"""Assemble the per-stage, per-term device memory of a training config (spec section 8).

    forward/backward peak = W + G + O + in_flight * activations + ZeRO-3 working set + buffers
    optimizer-step peak   = W + G + O + optimizer transients (no activations)
    device total          = max(both) * (1 + fragmentation) + CUDA context + calibration

Every stage is estimated; the worst one is the peak. The phase of the peak is reported because
the right remedy depends on it (a smaller micro-batch does not fix an optimizer-step peak).
"""

from __future__ import annotations

import math

from dssup.memory.activations import Ctx, Term, keep, layer_terms, stage_io_terms
from dssup.memory.config import Convention, Layout, Overheads, Training
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.result import ActivationTerm, Estimate, ParamCounts, StageBytes, StageEstimate
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import StageParams, padded_vocab, partition, stage_params
from dssup.memory.validate import validate
from dssup.memory.zero import model_states

__all__ = ["estimate", "in_flight", "make_ctx", "stage_activation_terms"]


def make_ctx(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> Ctx:
    return Ctx(
        m=m,
        conv=conv,
        t=layout.tp,
        seq=layout.tp if layout.sp else 1,
        s=training.seq_len // layout.cp,
        s_full=training.seq_len,
        flash=r.flash,
        dropout=r.dropout,
        ep=layout.ep,
        etp=layout.etp,
        imbalance=training.moe_imbalance,
        vocab=padded_vocab(m, layout.tp, conv),
    )


def in_flight(layout: Layout, stage: int, grad_accum: int) -> tuple[int, float]:
    """Micro-batches whose activations are alive at the peak of ``stage``, and the interleaving
    factor (1F1B: min(PP - i, m); interleaved: x (1 + (PP-1)/(PP*VPP)); DualPipe: PP + 1)."""
    pp = layout.pp
    if pp == 1:
        return 1, 1.0
    if layout.schedule == "dualpipe":
        return pp + 1, 1.0
    count = min(pp - stage, grad_accum)
    if layout.schedule == "interleaved":
        return count, 1.0 + (pp - 1) / (pp * layout.vpp)
    return count, 1.0


def stage_activation_terms(c: Ctx, m: ModelSpec, layers: range, sp: StageParams) -> list[Term]:
    """Per-sample terms of one stage, summed by name over its layers (before recompute)."""
    sums: dict[tuple[str, str], int] = {}
    for moe_layer, count in ((True, sp.moe_layers), (False, sp.dense_layers)):
        if count:
            for t in layer_terms(c, moe_layer):
                sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes * count
    mtp = layer_terms(c, m.moe is not None) if (sp.last and m.mtp_depth) else []
    for t in stage_io_terms(c, sp.first, sp.last, mtp):
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return [Term(name, group, b) for (name, group), b in sums.items()]


def _zero3_working_set(sp: StageParams, training: Training, ov: Overheads, r: Resolved) -> int:
    if training.zero_stage < 3:
        return 0
    live = min(ov.zero3_max_live_parameters, sp.largest_layer + ov.zero3_prefetch_bucket)
    return r.precision.weights * live


def _stage(
    m: ModelSpec,
    layout: Layout,
    training: Training,
    ov: Overheads,
    conv: Convention,
    r: Resolved,
    stage: int,
    layers: range,
) -> tuple[StageEstimate, str]:
    sp = stage_params(m, layout, conv, layers, stage)
    split = sp.split.scale(2) if layout.schedule == "dualpipe" else sp.split
    ms = model_states(
        split.non_moe,
        split.moe,
        layout.dp * (layout.cp if conv == "megatron" else 1),
        layout.edp,
        training.zero_stage,
        r.precision,
        training.offload_optimizer,
        training.offload_params,
    )
    c = make_ctx(m, layout, training, conv, r)
    terms = stage_activation_terms(c, m, layers, sp)
    b = training.micro_batch
    kept = [
        ActivationTerm(name=t.name, bytes=t.bytes * b)
        for t in terms
        if keep(t.group, training.recompute)
    ]
    per_mb = sum(t.bytes for t in kept)
    count, factor = in_flight(layout, stage, training.grad_accum)
    acts = math.ceil(per_mb * count * factor)
    ws = _zero3_working_set(sp, training, ov, r)
    static = ms.weights + ms.gradients + ms.optimizer
    fb = static + acts + ws + r.comm_buffer_bytes
    transient = (
        0 if training.offload_optimizer else r.optimizer_transient_per_param * ms.shard_params
    )
    opt = static + transient
    phase = "forward-backward" if fb >= opt else "optimizer-step"
    allocated = max(fb, opt)
    frag = math.ceil(allocated * r.fragmentation)
    total = allocated + frag + r.cuda_context_bytes + ov.calibration_bytes
    sbytes = StageBytes(
        weights=ms.weights,
        gradients=ms.gradients,
        optimizer=ms.optimizer,
        activations=acts,
        activations_per_micro_batch=per_mb,
        in_flight_micro_batches=count,
        in_flight_factor=factor,
        zero3_working_set=ws,
        buffers=r.comm_buffer_bytes,
        optimizer_transient=transient,
        calibration=ov.calibration_bytes,
        fragmentation=frag,
        cuda_context=r.cuda_context_bytes,
        total=total,
    )
    params = ParamCounts(total=split.total, moe=split.moe, non_moe=split.non_moe)
    host = ms.host + (transient if training.offload_optimizer else 0)
    return StageEstimate(
        stage=stage,
        layers=list(layers),
        params=params,
        bytes=sbytes,
        host_bytes=host,
        activation_terms=kept,
        phase=phase,
    ), phase


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
    ov = overheads or Overheads()
    r = resolve(convention, training, ov)
    stages, phases = [], []
    for i, layers in enumerate(partition(model.layers, layout)):
        st, phase = _stage(model, layout, training, ov, convention, r, i, layers)
        stages.append(st)
        phases.append(phase)
    peak = max(range(len(stages)), key=lambda i: stages[i].bytes.total)
    peak_bytes = stages[peak].bytes.total
    fits = None if gpu_memory_bytes is None else peak_bytes <= gpu_memory_bytes
    headroom = None if gpu_memory_bytes is None else gpu_memory_bytes - peak_bytes
    from dssup.memory.assumptions import assumptions

    return Estimate(
        convention=convention,
        model=model.name,
        world_size=layout.world_size,
        stages=stages,
        peak_stage=peak,
        peak_bytes=peak_bytes,
        peak_phase=phases[peak],
        gpu_memory_bytes=gpu_memory_bytes,
        fits=fits,
        headroom_bytes=headroom,
        assumptions=assumptions(model, layout, training, convention, r),
    )
