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
  PP (DeepSeek's ``dualpipe.py`` asserts an even rank count) when the framework runs it
  (``dualpipe``: framework ``deepseek``, or ``--schedule dualpipe`` pinned). Megatron-core has
  no DualPipe schedule (no ``dualpipe`` anywhere in NVIDIA/Megatron-LM at d98e8a64dd); its
  counterpart, the expert all-to-all of one micro-batch behind another's compute
  (``overlap_moe_expert_parallel_comm``), is ``CostModel.ep_overlap`` on 1F1B/interleaved.

CP, ETP and sequence parallelism are kept as given; an explicit ``layers_per_stage`` stays with
its own PP and VPP, under any schedule with that many chunks (other choices split evenly); and every field named in ``fixed`` is (``tp``, ``pp``, ``ep``, ``schedule``, ``vpp``): an option the user
states pins the search instead of being silently replaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dssup.memory.config import Layout, Schedule
from dssup.memory.spec import ModelSpec
from dssup.memory.splits import split_family, split_vpps
from dssup.memory.validate import divisors

__all__ = ["FIXABLE", "SplitSearch", "layout_splits", "search_layouts", "vpp_choices"]


@dataclass(frozen=True, slots=True)
class SplitSearch:
    """What the split search needs beyond the layout: whether the framework builds MTP (the
    account-for splits count its modules as layers)."""

    mtp: bool


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
    dualpipe: bool = False,
    splits: SplitSearch | None = None,
    schedules: tuple[Schedule, ...] | None = None,
) -> Iterator[Layout]:
    """Every layout of the search space for ``world`` GPUs (validity is checked by the caller);
    the fields in ``fixed`` keep ``base``'s value; ``dualpipe``: the framework runs DualPipe;
    ``splits``: also every uneven split of ``splits.py`` (and the VPPs they make whole) for the
    layouts without a given split; ``schedules``: only these (None: every one offered)."""
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
            for ep in eps:
                if (tp * base.cp * dp) % (ep * base.etp):
                    continue
                common = {"tp": tp, "pp": pp, "dp": dp, "ep": ep}
                for schedule, vpp in _schedules(
                    m, base, pp, max_vpp, fixed, dualpipe, splits, schedules
                ):
                    for split in layout_splits(m, base, pp, vpp, schedule, splits):
                        yield base.model_copy(
                            update={
                                **common,
                                "schedule": schedule,
                                "vpp": vpp,
                                "layers_per_stage": split,
                            }
                        )


def layout_splits(
    m: ModelSpec, base: Layout, pp: int, vpp: int, schedule: Schedule, splits: SplitSearch | None
) -> list[tuple[int, ...] | None]:
    """The layer splits to try for one (PP, VPP, schedule): a given split is one layer count
    per model chunk and fits every layout with its PP and VPP (1F1B and DualPipe alike); else
    the even split, and with ``splits`` the uneven family of ``splits.py``."""
    if base.layers_per_stage is not None and (pp, vpp) == (base.pp, base.vpp):
        return [base.layers_per_stage]
    if splits is None or pp == 1:
        return [None]
    return [s.counts for s in split_family(m, pp, vpp, schedule, splits.mtp)]


def _schedules(
    m: ModelSpec,
    base: Layout,
    pp: int,
    max_vpp: int,
    fixed: tuple[str, ...],
    dualpipe: bool,
    splits: SplitSearch | None,
    schedules: tuple[Schedule, ...] | None,
) -> list[tuple[Schedule, int]]:
    out: list[tuple[Schedule, int]] = [("1f1b", 1)]
    vpps = vpp_choices(m.layers, pp, max_vpp)
    if splits is not None:  # an account-for split makes more interleavings whole
        vpps = split_vpps(m, pp, max_vpp, splits.mtp)
    out += [("interleaved", v) for v in vpps]
    dualpipe = dualpipe or ("schedule" in fixed and base.schedule == "dualpipe")
    if m.moe is not None and pp % 2 == 0 and dualpipe:
        out.append(("dualpipe", 1))
    own = (base.schedule, base.vpp)
    if pp == base.pp and base.layers_per_stage is not None and own not in out:
        out.append(own)  # the given split makes its own (uneven) interleaving possible
    if "schedule" in fixed:
        out = [(s, v) for s, v in out if s == base.schedule]
    if "vpp" in fixed:
        out = [(s, v) for s, v in out if v == base.vpp]
    if schedules is not None:
        out = [(s, v) for s, v in out if s in schedules]
    return out
