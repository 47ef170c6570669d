"""The plain-language list of what an estimate assumed, shipped with every result.

An estimate is only as useful as its caveats: a reader must see which convention, which
defaults and which simplifications produced the number before trusting it with a job.
"""

from __future__ import annotations

from dssup.memory.config import Convention, Layout, Training
from dssup.memory.defaults import Resolved
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import traced_assumptions

__all__ = ["assumptions"]

_GIB = float(1 << 30)


def _common(layout: Layout, training: Training, r: Resolved) -> list[str]:
    p = r.precision
    out = [
        f"bytes per parameter: weights {p.weights}, gradients {p.gradients}, optimizer "
        f"{p.optimizer} (master {p.master} + 2 Adam moments of {p.moments})",
        f"ZeRO stage {training.zero_stage}: non-MoE states sharded over DP, MoE over "
        f"EDP={layout.edp}",
        "flash/fused attention: the s^2 scores are not stored"
        if r.flash
        else "attention scores (softmax) stored: b*n_h*s^2 per layer",
        f"dropout masks {'stored' if r.dropout else 'absent (no dropout)'}",
        f"recompute: {training.recompute}",
        f"overheads: comm buffers {r.comm_buffer_bytes / _GIB:.2f} GiB, fragmentation "
        f"{r.fragmentation:.0%}, CUDA context {r.cuda_context_bytes / _GIB:.2f} GiB",
    ]
    if layout.pp > 1:
        out.append(
            f"pipeline schedule {layout.schedule}: stage i holds min(PP - i, m) "
            "micro-batches of activations"
        )
    if training.zero_stage == 3:
        out.append(
            "ZeRO-3 working set: min(max_live_parameters, largest layer + prefetch "
            "bucket) gathered weights"
        )
    if training.offload_optimizer:
        out.append("optimizer offload: master weights and Adam moments in host memory")
    return out


def _conventional(m: ModelSpec, conv: Convention, training: Training) -> list[str]:
    if conv == "paper":
        out = [
            "convention paper: arXiv 2502.07846 formulas, W_QR and shared experts replicated "
            "over TP, no final norm, no MTP, no logits"
        ]
        if m.moe is not None:
            out.append("paper expert tokens: E_token = b*s*N_r/N spread over the EP group")
        return out
    out = [
        "convention megatron: W_QR split by TP, vocabulary padded to 128*TP, FP32 logits "
        "kept for the loss on the last stage"
    ]
    if m.moe is not None:
        out.append(
            f"routed token-slots per rank b*s*N_r*ETP/TP x imbalance "
            f"{training.moe_imbalance:g}; shared experts split by TP"
        )
    if m.mtp_depth:
        out.append(f"{m.mtp_depth} MTP module(s) on the last stage")
    return out


def assumptions(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> list[str]:
    out = _conventional(m, conv, training) + _common(layout, training, r)
    prof = training.implementation
    if isinstance(prof, TracedProfile):
        return traced_assumptions(prof, m, layout, training) + out
    if prof is not None:
        out.insert(
            0,
            f"eager implementation profile ({prof.source}, traced at seq_len "
            f"{prof.seq_len}): activation and optimizer-step bytes from traces replace "
            "the convention's activation terms",
        )
    return out
