"""The planner's step time for one given config, for callers that judge a few configs at a time.

Why a function of its own: the webhook's resize, the supervisor's remedies and ``plan`` must rank
by one cost model. ``plan`` folds the model per layout and evaluates thousands of configs;
``step_time`` runs the same folding (``fold_layout``) and the same ``cost_terms`` for a single
config, so a config re-evaluated here gets exactly the seconds the planner printed for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dssup.memory.config import Convention, Layout, Overheads, Precision, Training
from dssup.memory.core import PreparedDevice, prepare, states
from dssup.memory.cost import DEFAULT_RECOMPUTE, CostModel, LayoutCost, RecomputeSpec
from dssup.memory.curve import cost_curve, cost_terms
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.fold import layout_cost
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Topology, default_topology
from dssup.memory.validate import validate

__all__ = ["fold_layout", "recompute_spec", "step_time", "stored_per_sequence"]


def fold_layout(
    cm: CostModel,
    topo: Topology,
    m: ModelSpec,
    layout: Layout,
    seq: int,
    devices: Sequence[PreparedDevice],
    precision: Precision,
    imbalance: float = 1.0,
    recompute: RecomputeSpec = DEFAULT_RECOMPUTE,
    framework: str = "megatron",
) -> LayoutCost:
    """``layout_cost`` from the memory model's prepared devices: the largest device's
    parameters (DualPipe: both of its stages) and the most activation bytes a sequence stores
    on one device (its VPP chunks together; DualPipe: each sequence passes one of its two)."""
    split = max(devices, key=lambda d: d.split.total).split
    acts = stored_per_sequence(layout, devices)
    return layout_cost(
        cm,
        topo,
        m,
        layout,
        seq,
        acts,
        split.non_moe,
        split.moe,
        precision,
        imbalance,
        recompute,
        framework,
    )


def stored_per_sequence(layout: Layout, devices: Sequence[PreparedDevice]) -> int:
    """The most activation bytes one sequence stores on a device without recompute (its VPP
    chunks together; DualPipe: each sequence passes one of its two stages)."""
    share = 2 if layout.schedule == "dualpipe" and layout.pp > 1 else 1
    return max(sum(st.acts["none"] for st in d.stages) // share for d in devices)


def recompute_spec(r: Resolved) -> RecomputeSpec:
    """The resolved recompute settings (modules by framework, method, layers) as the cost
    model reads them."""
    return RecomputeSpec(r.recompute_modules, r.recompute_method, r.recompute_num_layers)


def step_time(
    model: ModelSpec,
    layout: Layout,
    training: Training,
    topology: Topology | None = None,
    cost: CostModel | None = None,
    convention: Convention = "megatron",
    overheads: Overheads | None = None,
) -> dict[str, float]:
    """Seconds per optimizer step of one config, by term (``total`` is their sum); the same
    figures ``plan`` gives the config. ``topology`` None: an H100 DGX node."""
    validate(model, layout, training)
    cm = cost or CostModel()
    topo = topology or default_topology()
    ov = overheads or Overheads()
    r = resolve(convention, training, ov)
    devices = prepare(model, layout, training, convention, r)
    lc = fold_layout(
        cm,
        topo,
        model,
        layout,
        training.seq_len,
        devices,
        r.precision,
        training.moe_imbalance,
        recompute_spec(r),
        r.framework,
    )
    shard = max(states(d, layout, training, convention, r, ov).ms.shard_params for d in devices)
    curve = cost_curve(
        cm,
        lc,
        training.recompute,
        training.zero_stage,
        training.offload_optimizer,
        training.offload_params,
        shard,
        r.precision,
    )
    return cost_terms(curve, training.micro_batch, training.grad_accum)
