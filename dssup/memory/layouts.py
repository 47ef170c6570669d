"""The parallel layouts ``plan --search-parallelism`` considers, schedules included.

Why schedules are part of the search: the pipeline bubble is ``(PP-1)/VPP`` micro-batches under
interleaved 1F1B and about a third of 1F1B's under DualPipe, which also hides the expert
all-to-all behind compute; a planner that only knows 1F1B cannot propose the layouts people
train MoE models with (DeepSeek-V3: PP16 DualPipe). What is searched:

* TP: powers of two up to ``max_tp`` (at most one node, so TP stays on NVLink);
* PP: divisors of the GPUs left, at most the layer count;
* EP: divisors of the routed experts whose EP x ETP divides TP x CP x DP;
* schedule: 1F1B; interleaved with every VPP >= 2 that splits the layers evenly
  (``validate.py`` requires PP x VPP to divide the layers); DualPipe on MoE models with an even
  PP (DeepSeek's ``dualpipe.py`` asserts an even rank count).

CP, ETP, sequence parallelism and an explicit ``layers_per_stage`` are kept as given, and so is
every field named in ``fixed`` (``tp``, ``pp``, ``ep``, ``schedule``, ``vpp``): an option the user
states pins the search instead of being silently replaced.
"""

from __future__ import annotations

from collections.abc import Iterator

from dssup.memory.config import Layout
from dssup.memory.spec import ModelSpec
from dssup.memory.validate import divisors

__all__ = ["FIXABLE", "dualpipe_micro_ok", "search_layouts", "vpp_choices"]


def vpp_choices(layers: int, pp: int, limit: int) -> list[int]:
    """Virtual stages per rank that split ``layers`` evenly over ``pp`` ranks (>= 2)."""
    if pp == 1 or layers % pp:
        return []
    return [v for v in divisors(layers // pp, limit) if v >= 2]


FIXABLE = ("tp", "pp", "ep", "schedule", "vpp")


def search_layouts(
    m: ModelSpec,
    base: Layout,
    world: int,
    max_tp: int,
    max_vpp: int,
    fixed: tuple[str, ...] = (),
) -> Iterator[Layout]:
    """Every layout of the search space for ``world`` GPUs (validity is checked by the caller);
    the fields in ``fixed`` keep ``base``'s value."""
    eps = [base.ep] if "ep" in fixed else (divisors(m.moe.n_routed) if m.moe else [1])
    tps = [base.tp] if "tp" in fixed else [d for d in divisors(world, max_tp) if d & (d - 1) == 0]
    for tp in tps:
        if world % (tp * base.cp):
            continue
        pps = divisors(world // (tp * base.cp), m.layers)
        for pp in [base.pp] if "pp" in fixed else pps:
            if pp not in pps:
                continue
            dp = world // (tp * pp * base.cp)
            keep_split = base.layers_per_stage if pp == base.pp else None
            for ep in eps:
                if (tp * base.cp * dp) % (ep * base.etp):
                    continue
                common = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "layers_per_stage": keep_split}
                for schedule, vpp in _schedules(m, base, pp, keep_split, max_vpp, fixed):
                    yield base.model_copy(update={**common, "schedule": schedule, "vpp": vpp})


def _schedules(
    m: ModelSpec,
    base: Layout,
    pp: int,
    split: tuple[int, ...] | None,
    max_vpp: int,
    fixed: tuple[str, ...],
) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = [("1f1b", 1)]
    if split is None:
        out += [("interleaved", v) for v in vpp_choices(m.layers, pp, max_vpp)]
    if m.moe is not None and pp % 2 == 0:
        out.append(("dualpipe", 1))
    if "schedule" in fixed:
        out = [(s, v) for s, v in out if s == base.schedule]
    if "vpp" in fixed:
        out = [(s, v) for s, v in out if v == base.vpp]
    return out


def dualpipe_micro_ok(pp: int, micro_batches: int) -> bool:
    """DualPipe runs an even number of micro-batches, at least two per rank
    (deepseek-ai/DualPipe ``dualpipe.py`` at bb214e8: ``num_chunks % 2 == 0 and
    num_chunks >= num_ranks * 2``)."""
    return micro_batches % 2 == 0 and micro_batches >= 2 * pp
