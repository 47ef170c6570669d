"""Bytes each parallel group moves, and on which link: the communication half of step time.

Why per group and per link: TP collectives run every layer and are cheap only on NVLink; the
expert all-to-all runs every MoE layer and crosses NICs as soon as EP x ETP exceeds a node;
data-parallel gradients move once per step (ZeRO 0/1), once per micro-batch (ZeRO 2: a sharded
gradient cannot be accumulated locally) or three times per micro-batch (ZeRO 3: gather for
forward and backward, reduce-scatter after). Volumes are the ring-algorithm bytes per GPU
(reduce-scatter and all-gather ``(n-1)/n`` of the buffer, all-reduce twice that; NCCL's
bus-bandwidth convention, nccl-tests ``doc/PERFORMANCE.md``).
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.memory.config import Layout, Recompute
from dssup.memory.flops import DeviceWork
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Link, Topology, group_link

__all__ = ["Links", "SeqComm", "Sizes", "dp_bytes", "layer_traffic", "links", "seq_comm"]


class Links(NamedTuple):
    """The link of every group of one layout (achieved bandwidths)."""

    tp: Link
    cp: Link
    ep: Link
    pp_bytes_per_s: float
    dp: Link  # dense gradients: DP x CP ranks
    edp: Link  # expert gradients: the expert data-parallel group
    nvlink: float
    nic: float


def links(topo: Topology, layout: Layout, nvlink_eff: float, nic_eff: float) -> Links:
    """Place every group (Megatron order tp-cp-ep-dp-pp; experts tp(etp)-ep-dp-pp); one
    ``Links`` per topology object and group sizes (the layer splits of a layout share it)."""
    tp, cp, dp, ep, etp = layout.tp, layout.cp, layout.dp, layout.ep, layout.etp
    key = (id(topo), tp, cp, dp, ep, etp, nvlink_eff, nic_eff)
    hit = _LINKS.get(key)
    if hit is None or hit[0] is not topo:
        if len(_LINKS) >= 4096:
            _LINKS.clear()
        hit = _LINKS[key] = (topo, _links(topo, tp, cp, dp, ep, etp, nvlink_eff, nic_eff))
    return hit[1]  # the entry keeps ``topo`` alive: its id is not reused


_LINKS: dict[tuple[int, int, int, int, int, int, float, float], tuple[Topology, Links]] = {}


def _links(
    topo: Topology, tp: int, cp: int, dp: int, ep: int, etp: int, nvlink_eff: float, nic_eff: float
) -> Links:
    nv, nic = topo.intra_node_bytes_per_s * nvlink_eff, topo.inter_node_bytes_per_s * nic_eff
    stride_pp = tp * cp * dp
    pp_bw = nv if stride_pp < topo.gpus_per_node else nic
    return Links(  # tp, cp, ep, pp, dp, edp (positional: cheaper than keywords, per layout)
        group_link(topo, tp, 1, nic, nv),
        group_link(topo, cp, tp, nic, nv),
        group_link(topo, ep, etp, nic, nv),
        pp_bw,
        group_link(topo, dp * cp, tp, nic, nv),
        group_link(topo, tp * cp * dp // (ep * etp), ep * etp, nic, nv),  # the EDP group
        nv,
        nic,
    )


class SeqComm(NamedTuple):
    """Seconds of communication per sequence (b = 1) on one device, by group and recompute."""

    tp: dict[Recompute, float]
    ep: dict[Recompute, float]
    cp: dict[Recompute, float]
    pp: float


def _a2a_seconds(lk: Links, payload: float, dedup_remote: float) -> float:
    """One all-to-all of ``payload`` bytes per GPU over the EP group.

    Uniform routing sends ``1 - 1/n`` of the payload away. The part that leaves the node goes
    through each GPU's own NIC (every GPU of the node sends at once), the rest over NVLink, both
    at the same time. ``dedup_remote`` scales the cross-node part when the dispatcher sends a
    token once per destination node instead of once per expert (DeepEP, HybridEP)."""
    link = lk.ep
    n = link.size
    if n == 1:
        return 0.0
    if link.intra:
        return payload * (n - 1) / n / lk.nvlink
    remote = payload * (1 - link.per_node / n) * dedup_remote
    local = payload * (link.per_node - 1) / n
    return max(remote / lk.nic, local / lk.nvlink)


Sizes = tuple[int, int, float]  # bytes per activation and per dispatched element, EP dedup


def seq_comm(
    m: ModelSpec, layout: Layout, work: DeviceWork, seq: int, lk: Links, sizes: Sizes
) -> SeqComm:
    """Per-sequence communication of one device: TP collectives (four per dense layer and
    direction with sequence parallelism: all-gather and reduce-scatter around attention and
    MLP; two around attention in an MoE layer, whose experts communicate over EP), EP dispatch
    and combine (two per MoE layer and direction), CP's key/value exchange, and PP sends.
    ``sizes``: bytes per activation and per dispatched element, and the cross-node dedup
    factor of the dispatch."""
    tp_fwd, ep_fwd = layer_traffic(m, layout, work, seq, lk, sizes)
    act_bytes = sizes[0]
    tokens = seq / layout.cp
    h = m.hidden
    t = layout.tp
    cp_fwd = 0.0
    if layout.cp > 1:  # ring attention: each rank passes its K and V around the CP ring
        kv = 2 * tokens * m.kv_heads * m.head_dim * act_bytes / t
        if m.mla is not None:
            a = m.mla
            kv = tokens * m.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
            kv = kv * act_bytes / t
        cp_fwd = work.layers * kv * (layout.cp - 1) / lk.cp.bytes_per_s
    chunks = layout.vpp if layout.schedule == "interleaved" else 1
    shard = t if layout.sp else 1
    pp = 0.0
    if layout.pp > 1:
        pp = 2 * chunks * tokens * h * act_bytes / shard / lk.pp_bytes_per_s
    return SeqComm(
        tp=_levels(tp_fwd),
        ep=_levels(ep_fwd),
        cp=_levels(cp_fwd),
        pp=pp,
    )


def layer_traffic(
    m: ModelSpec, layout: Layout, work: DeviceWork, seq: int, lk: Links, sizes: Sizes
) -> tuple[float, float]:
    """Forward seconds per sequence of one device's TP collectives and EP all-to-alls (what
    sets the pace with its compute, ``cost.pace``; ``seq_comm`` has the rest)."""
    act_bytes, dispatch_bytes, dedup_remote = sizes
    tokens = seq / layout.cp
    h = m.hidden
    t = layout.tp
    tp_one = (t - 1) / t * tokens * h * act_bytes / lk.tp.bytes_per_s if t > 1 else 0.0
    dense_layers = work.layers - work.moe_layers
    tp_fwd = tp_one * (4 * dense_layers + 2 * work.moe_layers)
    slot_tokens = work.slots / max(work.moe_layers, 1.0)  # routed slots per MoE layer
    disp = _a2a_seconds(lk, slot_tokens * h * dispatch_bytes, dedup_remote)
    comb = _a2a_seconds(lk, slot_tokens * h * act_bytes, dedup_remote)
    return tp_fwd, work.moe_layers * (disp + comb)


def _levels(fwd: float) -> dict[Recompute, float]:
    """Forward plus backward (the same collectives reversed); full recompute repeats forward."""
    return {"none": 2 * fwd, "selective": 2 * fwd, "full": 3 * fwd}


def dp_bytes(
    n: int, params: int, zero: int, gbytes: int, wbytes: int
) -> tuple[float, float, float, float]:
    """Bytes one GPU moves in a data-parallel group of ``n`` for ``params`` parameters under
    ZeRO ``zero``: (gradients per step, weights per step, gradients per micro-batch, weights per
    micro-batch)."""
    if n <= 1 or params == 0:
        return 0.0, 0.0, 0.0, 0.0
    ring = (n - 1) / n * params
    if zero == 0:
        return 2 * ring * gbytes, 0.0, 0.0, 0.0  # all-reduce of the gradients
    if zero == 1:  # reduce-scatter, then all-gather of the updated weights
        return ring * gbytes, ring * wbytes, 0.0, 0.0
    if zero == 2:  # a sharded gradient cannot accumulate: reduce-scatter after every micro-batch
        return 0.0, ring * wbytes, ring * gbytes, 0.0
    return 0.0, 0.0, ring * gbytes, 2 * ring * wbytes  # gather for forward and backward
