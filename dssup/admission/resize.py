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
from dssup.admission.config import Incomplete, resolve
from dssup.admission.evaluate import LRU, Evaluation, Evaluator
from dssup.admission.kinds import normalise
from dssup.admission.messages import gib, knobs
from dssup.admission.patch import Change, annotation_ops, expressible, render
from dssup.admission.settings import PolicySettings
from dssup.admission.source import read_sources
from dssup.errors import ConfigError
from dssup.memory import Candidate, Estimate, PlanRequest, PlanResult, plan

__all__ = ["Resize", "find_resize"]

_PLANS = LRU(512)
_TRIES = 16


@dataclass(frozen=True, slots=True)
class Resize:
    """The chosen candidate (None if nothing fits) and, when expressible, its patch."""

    candidate: Candidate | None
    patch: list[dict[str, Any]] | None
    estimate: Estimate
    peak_bytes: int
    advice: str
    short: str


def _plan(ev: Evaluation, settings: PolicySettings) -> PlanResult:
    cfg = ev.cfg
    allowed = expressible(ev.src, cfg.origins, cfg.training)
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
        layout=cfg.layout,
        training=cfg.training,
        recompute=recompute,
        zero_stages=zero,
        allow_offload=settings.allow_offload,
        search_parallelism=False,
        micro_batches=allowed["micro_batch"],
        margin=settings.plan_margin,
        convention=settings.convention,
    )
    key = (
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
) -> bool:
    """Re-read the patched object: it must state exactly the candidate and the same global batch."""
    try:
        patched = apply_ops(json.loads(json.dumps(obj)), ops)  # a copy; faster than deepcopy
        view = normalise(patched, evaluator.cache, ev.view.namespace)
        cfg = resolve(read_sources(view, evaluator.cache), evaluator.cache, view.world_size)
    except (PatchError, ConfigError, Incomplete):
        return False
    return (cfg.layout, cfg.training, cfg.global_batch) == (
        ev.cfg.layout,
        cand.training,
        ev.cfg.global_batch,
    )


def _words(change: Change) -> str:
    names = {
        "micro_batch": "micro-batch",
        "grad_accum": "grad-accum",
        "recompute": "recompute",
        "zero_stage": "ZeRO",
    }
    return ", ".join(f"{names[k]} {a}->{b}" for k, (a, b) in change.items())


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
        rendered = render(ev.src, change, ev.cfg.global_batch, ev.cfg.global_batch_stated)
        if rendered is None:
            continue
        ops, values = rendered
        est = evaluator.estimate(ev.cfg, cand.layout, cand.training, ev.gpu.usable_bytes)
        if not est.fits:
            continue
        values = dict(values)
        values[ann.ESTIMATE] = json.dumps(
            {
                "peakGiB": gib(est.peak_bytes),
                "usableGiB": gib(ev.gpu.usable_bytes),
                "gpu": ev.gpu.product,
                "fits": True,
            },
            separators=(",", ":"),
            sort_keys=True,
        )
        values[ann.RESIZED_FROM] = json.dumps(
            knobs(ev.cfg.training), separators=(",", ":"), sort_keys=True
        )
        values[ann.RESIZED_TO] = json.dumps(
            knobs(cand.training), separators=(",", ":"), sort_keys=True
        )
        patch = ops + annotation_ops(obj, values)
        if not _verify(obj, patch, ev, cand, evaluator):
            continue
        words = _words(change)
        return Resize(
            cand,
            patch,
            est,
            est.peak_bytes,
            f"closest fitting config: {words} (peak {gib(est.peak_bytes)} GiB)",
            words,
        )
    if first is not None:
        cand, change = first
        words = _words(change)
        return Resize(
            cand,
            None,
            ev.est,
            cand.peak_bytes,
            f"closest fitting config: {words} (peak {gib(cand.peak_bytes)} GiB); "
            "change it in the job (dssup cannot rewrite where it is stated)",
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
        "parallelism, more GPUs, or a GPU with more memory",
        "no config fits; more GPUs or a bigger GPU needed",
    )
