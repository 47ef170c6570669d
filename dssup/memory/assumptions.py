"""The plain-language list of what an estimate assumed, shipped with every result.

An estimate is only as useful as its caveats: a reader must see which convention, which
defaults and which simplifications produced the number before trusting it with a job.
"""

from __future__ import annotations

from dssup.memory.config import Convention, Layout, Overheads, Training
from dssup.memory.defaults import Resolved
from dssup.memory.describe import architecture_lines
from dssup.memory.framework_notes import framework_lines
from dssup.memory.offload import offload_assumptions
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import traced_assumptions

__all__ = ["assumptions"]

_GIB = float(1 << 30)


def _pipeline(layout: Layout) -> str:
    if layout.schedule == "dualpipe":
        return (
            "pipeline schedule dualpipe (arXiv 2412.19437 Table 2; deepseek-ai/DualPipe "
            "DualPipe.step): rank i holds stages i and PP-1-i with both stages' parameters; "
            "stage j keeps PP - j micro-batches at the rank's peak (PP + 1 per rank), the loss "
            "stage one at a time; needs an even m >= 2*PP"
        )
    if layout.schedule == "interleaved":
        g = layout.vpp_group or layout.pp
        return (
            f"pipeline schedule interleaved (Megatron-core get_pp_rank_microbatches): rank i "
            f"holds virtual stages i, i+PP, ..., runs 2(PP-i-1) + (VPP-1)*{g} warm-up forward "
            f"chunks and keeps up to min(that + 1, m*VPP) chunk micro-batches; the peak is the "
            f"worst point of its schedule"
        )
    return (
        f"pipeline schedule {layout.schedule}: stage i holds min(PP - i, m) "
        "micro-batches of activations"
    )


def _common(
    m: ModelSpec, layout: Layout, training: Training, r: Resolved, conv: Convention
) -> list[str]:
    p = r.precision
    out = [
        f"bytes per parameter: weights {p.weights}, gradients {p.gradients}, optimizer "
        f"{p.optimizer} (master {p.master} + 2 Adam moments of {p.moments})",
        f"ZeRO stage {training.zero_stage}: non-MoE states sharded over DP, MoE over "
        f"EDP={layout.edp}"
        if m.moe is not None
        else f"ZeRO stage {training.zero_stage}: states sharded over DP={layout.dp}",
    ]
    if conv == "paper":  # the megatron convention says both in its framework lines
        out.append(
            "flash/fused attention: the s^2 scores are not stored"
            if r.flash
            else "attention scores (softmax) stored: b*n_h*s^2 per layer"
        )
    out.append(f"dropout masks {'stored' if r.dropout else 'absent (no dropout)'}")
    if conv == "paper":
        out.append(f"recompute: {training.recompute}")
    out.append(
        f"overheads: comm buffers {r.comm_buffer_bytes / _GIB:.2f} GiB, fragmentation "
        f"{r.fragmentation:.0%}, CUDA context {r.cuda_context_bytes / _GIB:.2f} GiB"
    )
    if layout.pp > 1:
        out.append(_pipeline(layout))
    if training.zero_stage == 3 and conv == "paper":
        out.append(
            "ZeRO-3 working set: min(max_live_parameters, largest layer + prefetch "
            "bucket) gathered weights"
        )
    elif training.zero_stage == 3:
        out.append(
            "ZeRO-3 working set: the largest layer gathered whole (with the prefetch bucket, "
            "up to max_live_parameters) and its gradient before the reduce-scatter"
        )
    return out


def _shared(m: ModelSpec) -> bool:
    return m.moe is not None and m.moe.n_shared > 0


def _conventional(m: ModelSpec, conv: Convention, training: Training, r: Resolved) -> list[str]:
    if conv == "paper":
        replicated = " and ".join(
            x for x, on in (("W_QR", m.mla is not None), ("shared experts", _shared(m))) if on
        )
        over = f" {replicated} replicated over TP," if replicated else ""
        out = [
            f"convention paper: arXiv 2502.07846 formulas,{over} no final norm, no MTP, no logits"
        ]
        if m.moe is not None:
            out.append("paper expert tokens: E_token = b*s*N_r/N spread over the EP group")
        return out
    wqr = "W_QR split by TP, " if m.mla is not None else ""
    pad = (
        "vocabulary padded to 128*TP"
        if r.framework in ("megatron", "deepseek")
        else "vocabulary as configured (not padded)"
    )
    out = [f"convention megatron: {wqr}{pad}, FP32 logits kept for the loss on the last stage"]
    if m.moe is not None:
        out.append(
            f"routed token-slots per rank b*s*N_r*ETP/TP x imbalance "
            f"{training.moe_imbalance:g}; shared experts split by TP"
        )
    if m.mtp_depth and r.mtp:
        out.append(f"{m.mtp_depth} MTP module(s) on the last stage")
    return out


def assumptions(
    m: ModelSpec,
    layout: Layout,
    training: Training,
    conv: Convention,
    r: Resolved,
    ov: Overheads | None = None,
    gpus_per_node: int | None = None,
) -> list[str]:
    out = _conventional(m, conv, training, r) + _common(m, layout, training, r, conv)
    out += architecture_lines(m)
    out += offload_assumptions(conv, training, ov or Overheads(), gpus_per_node)
    if conv == "megatron":
        out += framework_lines(m, training, r)
    prof = training.implementation
    if isinstance(prof, TracedProfile):
        return traced_assumptions(prof, m, layout, training, r.precision) + out
    if prof is not None:
        out.insert(
            0,
            f"eager implementation profile ({prof.source}, traced at seq_len "
            f"{prof.seq_len}): activation and optimizer-step bytes from traces replace "
            "the convention's activation terms",
        )
    return out
