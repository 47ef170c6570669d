"""``dssup plan --explain N``: one row's step time term by term, and every figure behind it.

Why: a ranking is only as trustworthy as the numbers it rests on. The breakdown shows what the
step is made of (compute by kind, each communication before and after overlap, the pipeline
bubble, the optimizer on GPU or CPU), where every parallel group runs (NVLink or NICs, how many
nodes), the hardware figures with their sources and the model's constants.
"""

from __future__ import annotations

from dssup.memory import PlanResult
from dssup.memory.comm import links
from dssup.memory.cost import CostModel, tp_overlap

__all__ = ["render_explain", "render_hardware"]

_TERMS = {
    "compute.gemm": "GEMMs (forward + backward)",
    "compute.attention": "attention core (forward + backward)",
    "compute.memory_bound": "memory-bound kernels (norms, activations, permutes, loss)",
    "compute.moe_routing": "MoE token handling beyond GEMMs and all-to-all (fitted)",
    "compute.recompute": "recompute (re-forward)",
    "compute.weight_reads": "weight reads per micro-batch (small-batch cost)",
    "comm.tp_ep_cp_pp": "TP/EP/CP/PP traffic left exposed",
    "comm.zero_per_micro_batch": "ZeRO-2/3 and parameter-offload traffic left exposed",
    "comm.dp_grads": "gradient reduce left exposed",
    "comm.dp_params": "updated-weight all-gather left exposed",
    "comm.hidden_sm_cost": "slowdown of compute by overlapped communication",
    "pipeline.bubble": "pipeline fill and drain",
    "optimizer": "optimizer step",
}


def render_explain(res: PlanResult, row: int, cm: CostModel | None = None) -> str:
    c = res.candidates[row - 1]
    lay, t = c.layout, c.training
    sched = lay.schedule + (f" vpp {lay.vpp}" if lay.schedule == "interleaved" else "")
    off = "both" if t.offload_params else ("optimizer" if t.offload_optimizer else "none")
    world = lay.world_size
    tokens = t.micro_batch * t.grad_accum * lay.dp * t.seq_len
    lines = [
        "",
        f"row {row}: tp {lay.tp} pp {lay.pp} ({sched}) ep {lay.ep} cp {lay.cp} dp {lay.dp}; "
        f"micro {t.micro_batch} x accum {t.grad_accum}; recompute {t.recompute}; "
        f"ZeRO {t.zero_stage}; offload {off}",
        f"predicted step {c.step_time_s:.3f} s = {tokens / c.step_time_s / world:,.0f} "
        f"tokens/s/GPU ({tokens:,} tokens on {world} GPUs)",
    ]
    total = c.cost_terms["total"]
    for key, value in c.cost_terms.items():
        if key == "total":
            continue
        share = value / total if total else 0.0
        lines.append(f"  {value:10.3f} s  {share:6.1%}  {key:27s} {_TERMS.get(key, '')}")
    lines.append(f"  {total:10.3f} s  100.0%  total")
    lines.append("communication per step before overlap (s):")
    lines.append("  " + ", ".join(f"{k} {v:.3f}" for k, v in c.traffic.items() if v) or "  none")
    cm = cm or CostModel()
    lines.append(
        _overlaps(cm, t.framework or "megatron", lay.schedule == "dualpipe" and lay.pp > 1)
    )
    lines += render_placement(res, row, cm)
    lines += render_hardware(res)
    return "\n".join(lines)


def _overlaps(cm: CostModel, framework: str, dual: bool) -> str:
    """The overlap assumptions behind the exposed traffic (docs/step-time.md)."""
    tp = tp_overlap(cm, framework)
    why = "stated" if cm.tp_overlap is not None else f"framework {framework}"
    if dual:
        ep = "EP and PP ride DualPipe's overlapped chunks up to their compute"
    elif cm.ep_overlap:
        ep = f"EP behind another micro-batch's compute, PP {cm.pp_overlap:.0%}"
    else:
        ep = f"EP not hidden, PP {cm.pp_overlap:.0%}"
    return f"overlap assumed: TP {tp:.0%} hidden ({why}), CP {cm.cp_overlap:.0%}, {ep}"


def render_placement(res: PlanResult, row: int, cm: CostModel) -> list[str]:
    """Where each group of row ``row`` runs (Megatron rank order tp-cp-ep-dp-pp)."""
    lay, topo = res.candidates[row - 1].layout, res.topology
    lk = links(topo, lay, cm.nvlink_efficiency, cm.nic_efficiency)
    out = [f"placement ({topo.gpus_per_node} GPUs per node; achieved bandwidth per GPU):"]
    groups = [("TP", lk.tp), ("CP", lk.cp), ("DP", lk.dp)]
    if lay.ep > 1:
        groups += [("expert DP", lk.edp)]
    for name, link in groups:
        if link.size == 1:
            continue
        where = "inside one node" if link.intra else f"across {link.nodes} nodes"
        out.append(f"  {name} {link.size}: {where}, {link.bytes_per_s / 1e9:.0f} GB/s")
    ep = lk.ep
    if ep.size > 1:
        where = (
            f"inside one node, NVLink {lk.nvlink / 1e9:.0f} GB/s"
            if ep.intra
            else f"across {ep.nodes} nodes ({ep.per_node} per node): traffic leaving the node "
            f"at {lk.nic / 1e9:.0f} GB/s (NIC), the rest at {lk.nvlink / 1e9:.0f} GB/s (NVLink)"
        )
        out.append(f"  EP {ep.size} all-to-all: {where}")
    if lay.pp > 1:
        out.append(f"  PP {lay.pp}: stage to stage at {lk.pp_bytes_per_s / 1e9:.0f} GB/s")
    return out


def render_hardware(res: PlanResult) -> list[str]:
    """Every hardware figure and where it came from."""
    out = [f"hardware ({res.topology.gpu}; override with the flags in dssup plan -h):"]
    out += [f"  {line}" for line in res.topology.describe()]
    return out
