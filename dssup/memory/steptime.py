"""The planner's step time for one given config, for callers that judge a few configs at a time.

Why a function of its own: the webhook's resize, the supervisor's remedies and ``plan`` must rank
by one cost model. ``plan`` folds the model per layout and evaluates thousands of configs;
``step_time`` runs the same folding (``fold_layout``) and the same ``cost_terms`` for a single
config, so a config re-evaluated here gets exactly the seconds the planner printed for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dssup.memory.config import Convention, Layout, Overheads, Precision, Training
from dssup.memory.core import PreparedStage, device_split, prepare, states
from dssup.memory.cost import CostModel, LayoutCost, layout_cost
from dssup.memory.curve import cost_curve, cost_terms
from dssup.memory.defaults import resolve
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Topology, default_topology
from dssup.memory.validate import validate

__all__ = ["fold_layout", "step_time"]


def fold_layout(
    cm: CostModel,
    topo: Topology,
    m: ModelSpec,
    layout: Layout,
    seq: int,
    stages: Sequence[PreparedStage],
    precision: Precision,
    imbalance: float = 1.0,
) -> LayoutCost:
    """``layout_cost`` from the memory model's prepared stages: the largest device's
    parameters (DualPipe: both of its stages) and the most stored activations per sequence."""
    biggest = max(stages, key=lambda g: g.params.split.total)
    split = device_split(biggest, layout)
    acts = max(g.acts["none"] for g in stages)
    return layout_cost(
        cm, topo, m, layout, seq, acts, split.non_moe, split.moe, precision, imbalance
    )


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
    stages = prepare(model, layout, training, convention, r)
    lc = fold_layout(
        cm, topo, model, layout, training.seq_len, stages, r.precision, training.moe_imbalance
    )
    shard = max(states(st, layout, training, convention, r, ov).ms.shard_params for st in stages)
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
