"""The layer split ``estimate`` uses when none is given: the one of ``splits.py``'s family with
the lowest peak, stated among the assumptions with the peaks of the others.

Why: the question ``estimate`` answers is whether a layout fits, and an even split can make a
layout that trains fine look as if it does not (DeepSeek-V3 on 16 DualPipe stages: 85.5 GiB
even, 78.0 GiB with 3, 4 x 14, 2). Megatron users move layers off the overloaded ends with
``--decoder-first/last-pipeline-num-layers`` or the account-for flags; the estimate tries
those and says which it took, and ``--layers-per-stage`` still pins one. (``plan`` keeps the
fastest split of each config instead; ``estimate --layers-per-stage`` with a row's split gives
that row's bytes exactly.)
"""

from __future__ import annotations

from dssup.errors import ConfigError
from dssup.memory.config import Convention, Layout, Overheads, Training
from dssup.memory.defaults import resolve
from dssup.memory.estimate import estimate
from dssup.memory.spec import ModelSpec
from dssup.memory.splits import describe_split, split_family

__all__ = ["choose_split"]

_GIB = float(1 << 30)


def choose_split(
    model: ModelSpec,
    layout: Layout,
    training: Training,
    overheads: Overheads | None = None,
    convention: Convention = "megatron",
) -> tuple[Layout, str | None]:
    """``layout`` with the family's lowest-peak split and the assumption line saying so; the
    layout unchanged (and None) when it has one stage or a given split, or under the paper
    convention (which reproduces the paper's own partition)."""
    if layout.pp == 1 or layout.layers_per_stage is not None or convention == "paper":
        return layout, None
    mtp = resolve(convention, training, overheads or Overheads()).mtp
    tried: list[tuple[str, str, int, Layout]] = []
    for sp in split_family(model, layout.pp, layout.vpp, layout.schedule, mtp):
        lay = layout.model_copy(update={"layers_per_stage": sp.counts})
        try:
            peak = estimate(model, lay, training, overheads, convention).peak_bytes
        except ConfigError:
            continue  # a split this layout cannot run (e.g. an uneven interleaving)
        words = "even" if sp.counts is None else describe_split(sp.counts)
        tried.append((words, sp.how, peak, lay))
    if len(tried) < 2:
        return (tried[0][3], None) if tried else (layout, None)
    words, how, peak, best = min(tried, key=lambda x: x[2])  # ties: the earlier (even first)
    others = "; ".join(f"{w}: {p / _GIB:.2f} GiB" for w, _, p, _ in tried if w != words)
    return best, (
        f"layer split {words} ({how}): the lowest peak of the {len(tried)} splits tried "
        f"({others}); --layers-per-stage pins one"
    )
