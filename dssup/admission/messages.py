"""Words for users: warnings (one line, <= 120 characters), denial messages and breakdowns.

A denial must say what to change: the per-stage numbers of the peak stage, the GPU's capacity,
and the closest config that would fit written in the job's own terms (its flags or our
annotations).
"""

from __future__ import annotations

import json
from typing import Any

from dssup.memory import Estimate, Layout, Training

__all__ = ["breakdown", "describe", "estimate_note", "gib", "knobs", "peak_terms", "unseen"]

GiB = float(1 << 30)


def gib(n: int) -> float:
    return round(n / GiB, 1)


def describe(layout: Layout, training: Training) -> str:
    parts = [f"TP={layout.tp}", f"PP={layout.pp}"]
    if layout.ep > 1:
        parts.append(f"EP={layout.ep}")
    if layout.cp > 1:
        parts.append(f"CP={layout.cp}")
    parts += [
        f"DP={layout.dp}",
        f"mbs={training.micro_batch}",
        f"accum={training.grad_accum}",
        f"recompute={training.recompute}",
        f"ZeRO-{training.zero_stage}",
    ]
    return " ".join(parts)


def knobs(training: Training, gpus: int | None = None) -> dict[str, Any]:
    extra = {"gpus": gpus} if gpus is not None else {}
    return {
        **extra,
        "microBatch": training.micro_batch,
        "gradAccum": training.grad_accum,
        "recompute": training.recompute,
        "zeroStage": training.zero_stage,
    }


_ORIGIN_KNOBS = {
    "micro_batch": "microBatch",
    "global_batch": "globalBatch",
    "seq_len": "seqLength",
    "recompute": "recompute",
    "zero_stage": "zeroStage",
}


def unseen(
    origins: dict[str, str], kind: str, seen: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """Knobs read from job-level ``dssup.io/`` annotations that the pods do not see (a bare
    Pod's annotations are its own); ``seen``: knobs the pods' own view states alike."""
    if kind == "Pod":
        return ()
    return tuple(
        name
        for knob, name in _ORIGIN_KNOBS.items()
        if origins.get(knob) == "annotation" and knob not in seen
    )


def estimate_note(
    peak_bytes: int, gpu: Any, training: Training, global_batch: int, assumed: tuple[str, ...]
) -> str:
    """``dssup.io/estimate``: the verdict and the config it is for, as the pods will run it;
    ``assumedFromJobAnnotations`` names knobs the pods cannot see (taken on the job's word)."""
    doc: dict[str, Any] = {
        "fits": True,
        "gpu": gpu.product,
        "peakGiB": gib(peak_bytes),
        "usableGiB": gib(gpu.usable_bytes),
        "config": {**knobs(training), "globalBatch": global_batch, "seqLength": training.seq_len},
    }
    if assumed:
        doc["assumedFromJobAnnotations"] = list(assumed)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def peak_terms(est: Estimate) -> str:
    b = est.peak.bytes
    other = b.total - b.weights - b.gradients - b.optimizer - b.activations
    return (
        f"weights {gib(b.weights)}, grads {gib(b.gradients)}, optimizer {gib(b.optimizer)}, "
        f"activations {gib(b.activations)}, other {gib(other)} GiB"
    )


def breakdown(
    est: Estimate, layout: Layout, training: Training, gpu: Any, global_batch: int
) -> dict[str, Any]:
    """The JSON ``dssup admit`` prints and the webhook logs at debug level."""
    return {
        "model": est.model,
        "gpu": {
            "product": gpu.product,
            "totalGiB": gib(gpu.total_bytes),
            "usableGiB": gib(gpu.usable_bytes),
            "cudaGiB": gib(gpu.cuda_bytes),
            "source": gpu.source,
            "sharedBy": gpu.shared_by,
        },
        "config": {
            "tp": layout.tp,
            "pp": layout.pp,
            "ep": layout.ep,
            "etp": layout.etp,
            "cp": layout.cp,
            "dp": layout.dp,
            "globalBatch": global_batch,
            "seqLength": training.seq_len,
            **knobs(training),
        },
        "peakGiB": gib(est.peak_bytes),
        "peakStage": est.peak_stage,
        "peakPhase": est.peak_phase,
        "fits": bool(est.fits),
        "nearLimit": bool(est.near_limit),
        "uncertainty": {"fraction": est.uncertainty, "source": est.uncertainty_source},
        "stages": [
            {
                "stage": s.stage,
                "totalGiB": gib(s.bytes.total),
                "weightsGiB": gib(s.bytes.weights),
                "gradientsGiB": gib(s.bytes.gradients),
                "optimizerGiB": gib(s.bytes.optimizer),
                "activationsGiB": gib(s.bytes.activations),
            }
            for s in est.stages
        ],
    }
