"""Find the cheapest config that fits *and* that the job's own statements can express.

``dssup.memory.plan`` ranks fitting configs (micro-batch with accumulation so the global batch
stays exact, recompute, ZeRO) by predicted step time. Walking that list, the first candidate
whose patch renders and whose patched object re-reads as exactly that candidate wins; the
re-read proves the patch is complete (every statement rewritten, the global batch unchanged),
which is also what makes the mutation idempotent. Plans are cached like estimates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dssup.admission import annotations as ann
from dssup.admission.applypatch import PatchError, apply_ops
from dssup.admission.cache import ClusterCache
from dssup.admission.config import JobConfig, resolve
from dssup.admission.evaluate import LRU, Evaluation, Evaluator
from dssup.admission.flags import LAUNCHER
from dssup.admission.kinds import normalise
from dssup.admission.messages import estimate_note, gib, knobs, unseen
from dssup.admission.patch import Change, annotation_ops, expressible, render
from dssup.admission.settings import PolicySettings
from dssup.admission.source import Incomplete, read_sources
from dssup.admission.view import PodSetView
from dssup.admission.visible import pods_config, seen_knobs
from dssup.admission.wire import copy_json
from dssup.errors import ConfigError
from dssup.memory import Candidate, Estimate, Layout, PlanRequest, PlanResult, plan
from dssup.memory.topology import topology_of

__all__ = ["Resize", "find_resize"]

_PLANS = LRU(512)
_TRIES = 16
_MAX_SIZES = 16  # bigger sizes tried when the job may grow
_NNODES = LAUNCHER["nnodes"]


@dataclass(frozen=True, slots=True)
class Resize:
    """The chosen candidate (None if nothing fits) and, when expressible, its patch."""

    candidate: Candidate | None
    patch: list[dict[str, Any]] | None
    estimate: Estimate
    peak_bytes: int
    advice: str
    short: str


def _plan(
    ev: Evaluation, settings: PolicySettings, layout: Layout | None = None, *, free: bool = False
) -> PlanResult:
    """Fitting configs the job's statements can express (``free``: any, for advice)."""
    cfg = ev.cfg
    layout = layout or cfg.layout
    allowed = expressible(ev.src, cfg.origins, cfg.training)
    if free:
        allowed = {k: None for k in allowed}
    recompute = allowed["recompute"] or ("none", "selective", "full")
    zero = allowed["zero_stage"] or (0, 1, 2, 3)
    if not settings.allow_recompute:
        recompute = (cfg.training.recompute,)
    if not settings.allow_zero:
        zero = (cfg.training.zero_stage,)
    if cfg.training.recompute not in recompute:
        recompute = (*recompute, cfg.training.recompute)
    if cfg.training.zero_stage not in zero:
        zero = (*zero, cfg.training.zero_stage)
    req = PlanRequest(
        model=cfg.model,
        gpu_memory_bytes=ev.gpu.usable_bytes,
        global_batch=cfg.global_batch,
        layout=layout,
        world_size=layout.world_size,
        training=cfg.training,
        recompute=recompute,
        zero_stages=zero,
        allow_offload=settings.allow_offload,
        search_parallelism=False,
        micro_batches=allowed["micro_batch"],
        margin=settings.plan_margin,
        convention=settings.convention,
        topology=topology_of(ev.gpu.product),  # the planner's step times are for this GPU
    )
    key = (
        ev.gpu.product,
        cfg.model_key,
        req.layout,
        req.training,
        req.global_batch,
        req.gpu_memory_bytes,
        recompute,
        zero,
        allowed["micro_batch"],
        settings.allow_offload,
        settings.plan_margin,
    )
    res = _PLANS.get(key)
    if res is None:
        res = plan(req)
        _PLANS.put(key, res)
    return res  # type: ignore[no-any-return]


def _change(ev: Evaluation, cand: Candidate) -> Change | None:
    old, new = ev.cfg.training, cand.training
    if (old.offload_optimizer, old.offload_params) != (new.offload_optimizer, new.offload_params):
        return None
    change: Change = {}
    for knob in ("micro_batch", "grad_accum", "recompute", "zero_stage"):
        a, b = getattr(old, knob), getattr(new, knob)
        if a != b:
            change[knob] = (a, b)
    return change


def _verify(
    obj: Mapping[str, Any],
    ops: list[dict[str, Any]],
    ev: Evaluation,
    cand: Candidate,
    evaluator: Evaluator,
    change: Change,
) -> tuple[JobConfig, JobConfig] | None:
    """Re-read the patched object: it must state exactly the candidate and the same global
    batch; and what the pods see (the object without job-level knob annotations) must carry
    every changed knob's new value and the same global batch. Returns the patched object's
    config (its origins say what stays on the job's word), or None."""
    want = (cand.layout, cand.training, ev.cfg.global_batch)
    try:
        patched = apply_ops(copy_json(obj), ops)
        view = normalise(patched, evaluator.cache, ev.view.namespace)
        cfg = resolve(read_sources(view, evaluator.cache), evaluator.cache, view.world_size)
        if (cfg.layout, cfg.training, cfg.global_batch) != want:
            return None
        seen = pods_config(patched, evaluator.cache, ev.view.namespace)
    except (PatchError, ConfigError, Incomplete):
        return None
    changed = set(change) | ({"grad_accum"} if "micro_batch" in change else set())
    visible = seen.global_batch == ev.cfg.global_batch and all(
        getattr(seen.training, k) == getattr(cand.training, k) for k in changed
    )
    return (cfg, seen) if visible else None


_LABELS = {
    "micro_batch": "micro-batch",
    "grad_accum": "gradient accumulation",
    "recompute": "recompute",
    "zero_stage": "ZeRO stage",
}
_KNOB_ANNOTATION = {
    "micro_batch": ann.MICRO_BATCH,
    "recompute": ann.RECOMPUTE,
    "zero_stage": ann.ZERO_STAGE,
    "grad_accum": None,
}


def _settings(ev: Evaluation, change: Change, cache: ClusterCache) -> str:
    """Each changed knob as the setting that states it and the value that would fit."""
    parts = []
    for knob, (_, new) in change.items():
        try:
            found = ev.src.lookup(knob, _KNOB_ANNOTATION[knob], cache)
        except Incomplete:
            found = None
        if found is None:  # stated nowhere: the job's own default
            parts.append(f"{_LABELS[knob]} {new} (not stated in the job)")
            continue
        unseen = (
            " (a job annotation the pods do not see)"
            if found.origin == "annotation" and ev.view.kind != "Pod"
            else ""
        )
        parts.append(f"{found.where}={new}{unseen}")
    return ", ".join(parts)


def _words(change: Change) -> str:
    names = {
        "micro_batch": "micro-batch",
        "grad_accum": "grad-accum",
        "recompute": "recompute",
        "zero_stage": "ZeRO",
    }
    return ", ".join(f"{names[k]} {a}->{b}" for k, (a, b) in change.items())


@dataclass(frozen=True, slots=True)
class _Scale:
    """Grow one pod set to ``units`` (replicas, parallelism, numNodes) = ``gpus`` GPUs in all."""

    ps: PodSetView
    units: int
    gpus: int


def _attempt(
    obj: Mapping[str, Any],
    ev: Evaluation,
    evaluator: Evaluator,
    cand: Candidate,
    change: Change,
    scale: _Scale | None,
) -> Resize | None:
    rendered = render(
        ev.src,
        change,
        ev.cfg.global_batch,
        ev.cfg.global_batch_stated,
        cand.training.grad_accum,
        pin_global=scale is not None,
    )
    if rendered is None:
        return None
    ops, values = rendered
    est = evaluator.estimate(ev.cfg, cand.layout, cand.training, ev.gpu.usable_bytes)
    if not est.fits:
        return None
    world = ev.view.world_size
    if scale is not None:
        ops = ops + [{"op": "add", "path": p, "value": scale.units} for p in scale.ps.scale_paths]
    new_world = scale.gpus if scale else None
    values = dict(values)
    values[ann.RESIZED_FROM] = json.dumps(
        knobs(ev.cfg.training, world if scale else None), separators=(",", ":"), sort_keys=True
    )
    values[ann.RESIZED_TO] = json.dumps(
        knobs(cand.training, new_world), separators=(",", ":"), sort_keys=True
    )
    verified = _verify(obj, ops + annotation_ops(obj, values), ev, cand, evaluator, change)
    if verified is None:
        return None
    assumed = unseen(verified[0].origins, ev.view.kind, seen_knobs(*verified))
    values[ann.ESTIMATE] = estimate_note(
        est.peak_bytes, ev.gpu, cand.training, ev.cfg.global_batch, assumed
    )
    patch = ops + annotation_ops(obj, values)
    words = _words(change)
    if scale is not None:
        words = ", ".join(w for w in (f"GPUs {world}->{scale.gpus}", words) if w)
    return Resize(
        cand,
        patch,
        est,
        est.peak_bytes,
        f"closest fitting config: {words} (peak {gib(est.peak_bytes)} GiB)",
        words,
    )


def _scales(ev: Evaluation) -> list[_Scale]:
    """Bigger sizes the job allows (``dssup.io/max-gpus`` or PyTorchJob elasticPolicy)."""
    sets = [ps for ps in ev.view.training_sets if ps.scale_paths]
    if len(sets) != 1 or ev.src.has(_NNODES):
        return []  # ambiguous, or torchrun --nnodes would keep the old node count
    ps = sets[0]
    per_unit = ps.gpus_per_pod * ps.scale_step
    units = ps.pods // ps.scale_step
    limit = ps.max_units or units
    text = ev.view.annotations.get(ann.MAX_GPUS, "").strip()
    if text.isascii() and text.isdigit():
        limit = max(limit, units + (int(text) - ev.view.world_size) // per_unit)
    return [
        _Scale(ps, u, ev.view.world_size + (u - units) * per_unit)
        for u in range(units + 1, min(limit, units + _MAX_SIZES) + 1)
    ]


def _grow(
    obj: Mapping[str, Any], ev: Evaluation, evaluator: Evaluator, settings: PolicySettings
) -> Resize | None:
    lay = ev.cfg.layout
    for scale in _scales(ev):
        mp = lay.tp * lay.pp * lay.cp
        if scale.gpus % mp or ev.cfg.global_batch % (scale.gpus // mp):
            continue
        try:
            layout = Layout(**{**lay.model_dump(), "dp": scale.gpus // mp})
            res = _plan(ev, settings, layout)
        except ConfigError:
            continue
        for cand in res.candidates[:_TRIES]:
            change = _change(ev, cand)
            if change is None:
                continue
            found = _attempt(obj, ev, evaluator, cand, change, scale)
            if found is not None:
                return found
    return None


def find_resize(
    obj: Mapping[str, Any], ev: Evaluation, evaluator: Evaluator, settings: PolicySettings
) -> Resize:
    res = _plan(ev, settings)
    first: tuple[Candidate, Change] | None = None
    for cand in res.candidates[:_TRIES]:
        change = _change(ev, cand)
        if not change:
            continue
        first = first or (cand, change)
        found = _attempt(obj, ev, evaluator, cand, change, None)
        if found is not None:
            return found
    grown = _grow(obj, ev, evaluator, settings)
    if grown is not None:
        return grown
    if first is None:  # nothing expressible fits: is there a fit the job must make itself?
        first = next(
            (
                (c, ch)
                for c in _plan(ev, settings, free=True).candidates[:_TRIES]
                if (ch := _change(ev, c))
            ),
            None,
        )
    if first is not None:
        cand, change = first
        words = _words(change)
        return Resize(
            cand,
            None,
            ev.est,
            cand.peak_bytes,
            f"closest fitting config: {words} (peak {gib(cand.peak_bytes)} GiB); set "
            f"{_settings(ev, change, evaluator.cache)} (dssup cannot change it where the pods would see it)",
            words,
        )
    closest = res.closest
    tail = f"; closest: peak {gib(closest.peak_bytes)} GiB" if closest is not None else ""
    return Resize(
        None,
        None,
        ev.est,
        ev.est.peak_bytes,
        f"no micro-batch/recompute/ZeRO setting fits{tail}; use more pipeline or expert "
        "parallelism, more GPUs (annotation dssup.io/max-gpus lets dssup add "
        "data-parallel replicas), or a GPU with more memory",
        "no config fits; more GPUs or a bigger GPU needed",
    )
