"""The per-config half of the step-time model: a curve per (layout, ZeRO, offload, recompute)
and its evaluation at (micro-batch, accumulation), the planner's inner loop.

Why a module of its own: ``cost.py`` folds what a layout costs (compute, traffic, placement);
this folds the per-choice rest and evaluates it in a few float operations per config, and
gives the same total term by term (``cost_terms``) and the traffic before overlap
(``traffic``) for ``dssup plan --explain``.
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.memory.config import Precision, Recompute
from dssup.memory.cost import CostModel, LayoutCost

__all__ = ["CostCurve", "cost_at", "cost_curve", "cost_terms", "make_curve", "traffic"]


class CostCurve(NamedTuple):
    """Everything but (b, m) folded in; ``cost_at`` evaluates it."""

    seq: float  # compute per sequence
    exposed: float  # exposed TP/EP/CP/PP seconds per sequence, with the SM cost of the hidden
    dual: float  # EP (+ PP under DualPipe) seconds per sequence hidden behind compute when possible
    weight_reads: float
    per_mb: float  # ZeRO-3 gathers + parameter offload per micro-batch (behind its compute)
    grads_mb: float  # ZeRO-2/3 gradient reduce-scatter per micro-batch (behind its backward)
    grads: float  # per-step gradient sync (ZeRO 0/1)
    params: float  # per-step updated-weight all-gather (ZeRO 1/2)
    optimizer: float  # optimizer step (GPU Adam, or PCIe + CPU Adam)
    bubble: float
    fwd_share: float  # forward part of a micro-batch's compute
    overlap: float
    sm: float
    parts: tuple[float, float, float, float, float]  # per sequence: GEMM, attention,
    # memory-bound, MoE token handling, recompute
    traffic: tuple[float, float, float, float]  # per sequence: raw TP, EP, CP, PP seconds


def cost_curve(
    cm: CostModel,
    lc: LayoutCost,
    rc: Recompute,
    zero: int,
    off_opt: bool,
    off_par: bool,
    shard: int,
    precision: Precision,
) -> CostCurve:
    """Fold the (ZeRO, offload, recompute) choice and the optimizer shard into a curve."""
    grads, params, grads_mb, per_mb = lc.zero[zero]
    gb, wb = precision.gradients, precision.weights
    if rc == "full":  # the re-forward gathers the weights once more
        per_mb *= 1.5
    if off_par:  # ZeRO-Infinity: weights cross PCIe for forward, backward (and re-forward)
        per_mb += (3 if rc == "full" else 2) * lc.params * wb / lc.host
    if off_opt:
        cores = lc.cores_per_gpu or 1.0
        optimizer = shard * (gb + wb) / lc.host + shard / (cm.cpu_adam_params_per_core * cores)
    else:
        adam = 2 * (precision.master + 2 * precision.moments) + gb + wb
        optimizer = shard * adam / lc.hbm
    return make_curve(cm, lc, rc, per_mb, grads_mb, grads, params, optimizer)


def make_curve(
    cm: CostModel,
    lc: LayoutCost,
    rc: Recompute,
    per_mb: float,
    grads_mb: float,
    grads: float,
    params: float,
    optimizer: float,
) -> CostCurve:
    """The curve of one recompute level with the given data-parallel and optimizer seconds
    (``cost_curve``'s; the planner's lower bound passes zeros)."""
    part = lc.rc[rc]
    # tuple.__new__: a NamedTuple's own constructor is a Python function, and the planner
    # builds one curve per (layout, ZeRO, offload, recompute) that fits
    return tuple.__new__(
        CostCurve,
        (
            part.seq,
            part.exposed,
            part.dual,
            lc.weight_reads,
            per_mb,
            grads_mb,
            grads,
            params,
            optimizer,
            lc.bubble,
            part.fwd_share,
            cm.dp_overlap,
            cm.comm_sm_fraction,
            part.parts,
            part.traffic,
        ),
    )


def cost_at(c: CostCurve, b: int, m: int) -> float:
    """Seconds per optimizer step for micro-batch ``b`` and ``m`` micro-batches (hot loop).

    Each micro-batch takes its compute plus the exposed TP/EP/CP/PP traffic (DualPipe: what its
    overlapped chunks cannot hide), and the pipeline runs ``m + bubble`` of them. ZeRO-2/3 and
    parameter-offload traffic hides behind each micro-batch's compute (gradients behind its
    backward) and adds what it cannot hide, ``m`` times; the per-step gradient reduce hides
    behind the last backward, the weight all-gather behind the first forward. Hidden traffic
    still costs ``sm`` of its time (the SMs it occupies)."""
    comp = b * c.seq + c.weight_reads
    x = b * c.exposed
    if c.dual:  # the overlap keeps its communication SMs for the whole overlapped chunk
        d = b * c.dual
        x += d - comp + c.sm * comp if d > comp else c.sm * comp
    step = (m + c.bubble) * (comp + x) + c.optimizer
    h = c.overlap * comp
    fw = c.fwd_share * h
    bw = h - fw
    z, g = c.per_mb, c.grads_mb
    if z:
        step += m * (z - h + c.sm * h if z > h else c.sm * z)
    if g:
        step += m * (g - bw + c.sm * bw if g > bw else c.sm * g)
    g, p = c.grads, c.params
    if g:
        step += g - bw + c.sm * bw if g > bw else c.sm * g
    if p:
        step += p - fw + c.sm * fw if p > fw else c.sm * p
    return step


def traffic(c: CostCurve, b: int, m: int) -> dict[str, float]:
    """Seconds each kind of communication takes per step before any overlap (what the
    ``comm.*`` terms of ``cost_terms`` leave exposed of it)."""
    tp, ep, cp, pp = (m * b * v for v in c.traffic)
    return {
        "tp": tp,
        "ep": ep,
        "cp": cp,
        "pp": pp,
        "dp.grads": c.grads,
        "dp.params": c.params,
        "zero.grads_per_micro_batch": m * c.grads_mb,
        "zero.weights_or_offload_per_micro_batch": m * c.per_mb,
    }


def _hide(amount: float, window: float, sm: float) -> tuple[float, float]:
    """(exposed, SM cost of the hidden part) of ``amount`` behind ``window`` seconds."""
    if amount > window:
        return amount - window, sm * window
    return 0.0, sm * amount


def cost_terms(c: CostCurve, b: int, m: int) -> dict[str, float]:
    """The same step time as ``cost_at``, by term (seconds per step); ``total`` is their sum."""
    comp = b * c.seq + c.weight_reads
    gemm, core, elem, moe, extra = (b * v for v in c.parts)
    out = {
        "compute.gemm": m * gemm,
        "compute.attention": m * core,
        "compute.memory_bound": m * elem,
        "compute.moe_routing": m * moe,
        "compute.recompute": m * extra,
        "compute.weight_reads": m * c.weight_reads,
    }
    mb_comm, mb_sm = b * c.exposed, 0.0
    if c.dual:
        exp, _ = _hide(b * c.dual, comp, c.sm)
        mb_comm += exp
        mb_sm += c.sm * comp
    out["comm.tp_ep_cp_pp"] = m * mb_comm
    out["pipeline.bubble"] = c.bubble * (comp + mb_comm + mb_sm)
    h = c.overlap * comp
    fw = c.fwd_share * h
    z_exp, z_sm = _hide(c.per_mb, h, c.sm)
    g_exp, g_sm = _hide(c.grads_mb, h - fw, c.sm)
    out["comm.zero_per_micro_batch"] = m * (z_exp + g_exp)
    s_exp, s_sm = _hide(c.grads, h - fw, c.sm)
    p_exp, p_sm = _hide(c.params, fw, c.sm)
    out["comm.dp_grads"] = s_exp
    out["comm.dp_params"] = p_exp
    out["comm.hidden_sm_cost"] = m * (mb_sm + z_sm + g_sm) + s_sm + p_sm
    out["optimizer"] = c.optimizer
    out["total"] = sum(out.values())
    return out
