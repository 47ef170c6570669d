"""Find the configs that fit a GPU, fastest first, with the global batch exact.

The search varies micro-batch (with the matching gradient accumulation, so that
micro x accumulation x DP = global batch always), recompute level, ZeRO stage, offload and, on
request, TP/PP/EP/schedule/VPP (``layouts.py``), the layer split (``splits.py``) and the
framework (``frameworks.py``). This module decides what is swept and in which order: one
``search.Search`` per framework, the splits of a layout together, and -- with ``bound`` -- the
layouts in the order of their step-time lower bound (``bound.py``), skipping what cannot reach
the rows kept. The sweep uses exactly the arithmetic of ``estimate`` (a planned config
re-estimates to the same bytes); the request and result shapes are ``plan_types.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from dssup.errors import ConfigError
from dssup.memory.bound import Kept
from dssup.memory.config import (
    Layout,
    Schedule,
)
from dssup.memory.frameworks import framework_schedules
from dssup.memory.layouts import SplitSearch, layout_splits, search_layouts
from dssup.memory.params import model_total
from dssup.memory.plan_types import BandInfo, Candidate, PlanRequest, PlanResult
from dssup.memory.schedule import check_micro_batches
from dssup.memory.search import KeptRow, Search, hit_bytes
from dssup.memory.topology import Topology, default_topology
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import check_profile, without_untraced_mtp
from dssup.memory.validate import check_split, divisors

__all__ = ["BandInfo", "Candidate", "PlanRequest", "PlanResult", "plan"]


def _world(req: PlanRequest) -> int:
    return req.world_size or req.layout.world_size


def _layouts(
    req: PlanRequest, schedules: tuple[Schedule, ...] | None, mtp: bool
) -> Iterator[Layout]:
    base, world, m = req.layout, _world(req), req.model
    splits = SplitSearch(mtp) if req.search_splits else None
    if not req.search_parallelism:
        mp = base.tp * base.pp * base.cp
        if world % mp:
            raise ConfigError(
                "world_size",
                f"{world} GPUs is not a multiple of tp*pp*cp={mp}",
                "change the GPU count or the layout",
            )
        if schedules is not None and base.schedule not in schedules:
            return  # this framework does not run the given schedule (frameworks.py)
        for split in layout_splits(m, base, base.pp, base.vpp, base.schedule, splits):
            yield base.model_copy(update={"dp": world // mp, "layers_per_stage": split})
        return
    if base.layers_per_stage is not None:  # else every layout of its PP is skipped unseen
        check_split(m, base.layers_per_stage)
        if world % (base.pp * base.cp):
            raise ConfigError(
                "layers_per_stage",
                f"its {base.pp} pipeline stages (cp {base.cp}) do not divide {world} GPUs",
                "give one layer count per stage of a PP that divides the GPU count",
            )
    dualpipe = req.training.framework == "deepseek"
    yield from search_layouts(
        m, base, world, req.max_tp, req.max_vpp, req.fixed, dualpipe, splits, schedules
    )


def _nothing_to_search(req: PlanRequest, skipped: list[Layout]) -> ConfigError:
    """Why no config could even be evaluated: a pinned micro-batch that divides nothing, a
    schedule that refuses every accumulation count (``schedule.check_micro_batches``), or
    pinned layout fields that leave no layout."""
    if skipped:
        lay = skipped[0]
        rows = req.global_batch // lay.dp
        micro = [b for b in (req.micro_batches or divisors(rows)) if rows % b == 0]
        if not micro:
            return ConfigError(
                "micro_batch",
                f"{(req.micro_batches or (0,))[0]} does not divide the {rows} sequences per DP "
                "rank",
                "pick a divisor of global batch / DP, or leave --micro-batch out",
            )
        try:
            check_micro_batches(lay, rows // micro[0])
        except ConfigError as exc:
            return ConfigError("global_batch_size", exc.problem, exc.fix)
    pins = ", ".join(f"--{f} {getattr(req.layout, f)}" for f in req.fixed)
    if pins:
        return ConfigError(
            req.fixed[0],
            f"no valid layout for {_world(req)} GPUs with {pins}",
            "change or drop the pinned values (TP, PP, EP and VPP must divide the GPUs, heads, "
            "layers and experts)",
        )
    return ConfigError(
        "global_batch_size",
        f"no layout of {_world(req)} GPUs has a DP that divides {req.global_batch}",
        "use a global batch with more factors of two, or another GPU count",
    )


def plan(req: PlanRequest) -> PlanResult:
    """Every config in the search space that fits, ranked by the step-time model (``cost.py``)."""
    prof = req.training.implementation
    if isinstance(prof, TracedProfile):
        model, _ = without_untraced_mtp(req.model, prof)
        check_profile(prof, model_total(model, "megatron"), next(iter(prof.levels)))
        req = req.model_copy(update={"model": model})
    warnings: list[str] = []
    topo = req.topology
    if topo is None:
        topo = default_topology()
        warnings.append(
            f"no GPU given for the step-time model: ranking assumes {topo.gpu} "
            f"({topo.gpus_per_node} GPUs per node); pass the GPU to rank for your machine"
        )
    if req.cost.compute_dtype == "fp8" and topo.fp8_flops is None:
        raise ConfigError(
            "compute_dtype",
            f"{topo.gpu} has no FP8 tensor cores",
            "use --compute-dtype bf16 (or a GPU with FP8, e.g. H100)",
        )
    if req.offloads and set(req.offloads) - {"none"} and topo.host_cpu_cores is None:
        raise ConfigError(
            "host_cores",
            f"offload was asked for but the host CPU cores per node of {topo.gpu} are unknown",
            "pass --host-cores N (physical cores per node) so CPU Adam can be timed",
        )
    allow_offload = req.allow_offload
    if allow_offload and topo.host_cpu_cores is None:
        allow_offload = False
        warnings.append(
            f"CPU offload not considered: host CPU cores per node unknown for {topo.gpu} "
            "(pass --host-cores N to rank offload)"
        )
    kept, searches, skipped = _search(req, topo, allow_offload, req.bound)
    if req.bound and not kept.heap:  # nothing fits: sweep everything for the closest miss
        kept, searches, skipped = _search(req, topo, allow_offload, False)
    chosen = [sr.candidate(hit) for _, _, (hit, sr) in kept.ranked()]
    closest = None
    misses = [(sr.closest, sr) for sr in searches if sr.closest is not None]
    if not chosen and misses:
        hit, sr = min(misses, key=lambda x: hit_bytes(x[0]))
        closest = sr.candidate(hit)
    limited = [sr for sr in searches if sr.host_limited_bytes is not None]
    return PlanResult(
        candidates=chosen,
        evaluated=sum(sr.evaluated for sr in searches),
        fitting=sum(sr.count for sr in searches),
        closest=closest,
        closest_fits_gpu=closest is not None and closest.peak_bytes <= req.gpu_memory_bytes,
        topology=topo,
        warnings=warnings,
        host_limited=sum(sr.host_limited for sr in searches),
        host_limited_bytes=min((sr.host_limited_bytes or 0) for sr in limited) if limited else None,
        bands=[
            BandInfo(framework=sr.r.framework, fraction=sr.band.fraction, source=sr.band.source)
            for sr in searches
        ],
        near_limit=sum(sr.near_count for sr in searches),
        layouts_skipped=skipped,
        layouts_swept=sum(sr.layouts for sr in searches),
    )


def _search(
    req: PlanRequest, topo: Topology, allow_offload: bool, bound: bool
) -> tuple[Kept[KeptRow], list[Search], int]:
    """Every framework's search swept (bounded or not): the kept rows, the searches, and how
    many layouts the bound skipped."""
    kept: Kept[KeptRow] = Kept(req.limit)
    runs = [(Search(sub, topo, allow_offload, kept), sched) for sub, sched in _frameworks(req)]
    searches = [sr for sr, _ in runs]
    bases = [(sr, list(group)) for sr, sched in runs for group in _bases(sr, sched)]
    if not bases:
        first = next((sr for sr in searches if sr.skipped), searches[0])
        raise _nothing_to_search(first.req, first.skipped)
    return kept, searches, _sweep_bases(bases, kept, bound)


def _frameworks(req: PlanRequest) -> list[tuple[PlanRequest, tuple[Schedule, ...] | None]]:
    """One request per planned framework, and the schedules it contributes (frameworks.py)."""
    if req.frameworks is None:
        return [(req, None)]
    out = []
    for fw in dict.fromkeys(req.frameworks):
        training = req.training.model_copy(update={"framework": fw})
        sub = req.model_copy(update={"training": training, "frameworks": None})
        out.append((sub, framework_schedules(fw, req.frameworks)))
    return out


_Split = tuple[Layout, list[int]]


def _bases(sr: Search, schedules: tuple[Schedule, ...] | None) -> Iterator[list[_Split]]:
    """The runnable layouts of one framework's search, the splits of one base together."""
    for _, splits in itertools.groupby(_layouts(sr.req, schedules, sr.r.mtp), key=_base):
        group = []
        for layout in splits:
            micro = sr.runnable(layout)
            if micro is not None:
                group.append((layout, micro))
        if group:
            yield group


def _sweep_bases(bases: list[tuple[Search, list[_Split]]], kept: Kept[KeptRow], bound: bool) -> int:
    """Sweep every base layout (each config once with its best split); with ``bound``, in the
    order of their step-time lower bound, skipping what cannot reach the kept rows. Returns
    how many layouts were skipped."""
    if not bound:
        for sr, group in bases:
            for layout, micro in group:
                sr.layout(layout, micro)
            sr.flush()
        return 0
    order = []
    for i, (sr, group) in enumerate(bases):
        lbs = [sr.lower_bound(layout, micro) for layout, micro in group]
        order.append((min(lbs), i, sr, list(zip(lbs, group, strict=True))))
    order.sort(key=lambda x: x[:2])
    swept = 0
    for lb, _, sr, splits in order:
        if lb >= kept.threshold:  # every later base's bound is at least as high
            break
        for split_lb, (layout, micro) in splits:
            if split_lb < kept.threshold:
                swept += sr.layout(layout, micro, True)
        sr.flush()
    return sum(len(group) for _, group in bases) - swept


def _base(layout: Layout) -> tuple[object, ...]:
    """A layout without its layer split: the splits of one base are one layout's variants."""
    return (
        layout.tp,
        layout.pp,
        layout.ep,
        layout.etp,
        layout.cp,
        layout.dp,
        layout.schedule,
        layout.vpp,
    )
