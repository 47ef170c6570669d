"""``dssup calibrate`` backend: trace one layer of each kind and fit the eager profile.

For every recompute level it traces, under FakeTensorMode (full shapes, nothing allocated),
small models made of the run's own layers -- one layer of the first kind, then one more dense
and one more MoE layer -- at micro-batch 1 and 2, and solves the linear model documented in
``dssup.memory.profile`` exactly: the per-sample slope and constant of each layer kind and of
the stage (embedding, head, loss, MTP). The optimizer-step temporaries and the end-of-backward
term (the peak while the first block and the embedding run backward, over all gradients) come from
the same traces: the latter from the micro-batch 1 and 2 points of the one-layer model, since that
window holds the first layer and the embedding whatever the layer count.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dssup.memory import ModelSpec
from dssup.memory.profile import EagerProfile, LayerCoefficients, LevelBytes
from dssup.runtime.reference.config import RunSpec, precision_of
from dssup.runtime.reference.measure import Measurement, measure

__all__ = ["calibrate", "phase_peaks", "reduced_spec"]

LEVELS = ("none", "selective", "full")
MAX_MICRO_BATCH = 16


def reduced_spec(m: ModelSpec, dense: int, moe: int) -> ModelSpec:
    """``m`` with ``dense`` dense layers followed by ``moe`` MoE layers (MTP kept)."""
    if m.moe is None:
        return m.model_copy(update={"layers": dense})
    experts = m.moe.model_copy(update={"first_dense": dense, "every": 1, "dense_layers": ()})
    return m.model_copy(update={"layers": dense + moe, "moe": experts})


def kinds(m: ModelSpec) -> tuple[bool, bool]:
    """(has dense layers, has MoE layers)."""
    n_moe = m.moe_layer_count
    return n_moe < m.layers, n_moe > 0


def phase_peaks(meas: Measurement) -> tuple[int, int, int]:
    """(forward/backward peak, gradient bytes at that peak, optimizer-step peak) of the last
    measured step."""
    last = meas.run.steps
    pk = meas.phase_peaks
    fb = max(
        (pk[f"{last}:{ph}"] for ph in ("forward", "backward") if f"{last}:{ph}" in pk),
        key=lambda snap: snap["Total"],
    )
    return fb["Total"], fb.get("Gradient", 0), pk[f"{last}:optimizer"]["Total"]


class _Point(NamedTuple):
    residual: int  # fwd/bwd peak over W + O
    activation_regime: bool  # peak before most gradients exist
    step: float  # optimizer-step bytes per parameter over W + G + O
    tail: int  # end-of-backward peak over W + O + all gradients


class _Residuals(NamedTuple):
    low: int  # residual at b
    high: int  # residual at 2b
    b: int
    step: float
    tails: tuple[int, int]  # end-of-backward residual at micro-batch 1 and 2


def _point(run: RunSpec, b: int, params: int, tensors: int) -> _Point:
    """Residuals of one traced step at micro-batch ``b``.

    One step is traced: AdamW creates its state lazily in the first step, so the first
    forward/backward holds exactly what a steady-state one holds minus O (added back here), and
    the first optimizer step allocates exactly the steady-state states plus temporaries."""
    prec = precision_of(run.dtype)
    # Dropless routing has data-dependent shapes: FakeTensorMode cannot trace it, so its
    # (small-shape) calibration runs for real, cross-checked against torch.profiler.
    dropless = run.model.moe is not None and run.moe_routing == "dropless"
    meas = measure(
        run.model_copy(update={"micro_batch": b, "steps": 1}), "real" if dropless else "fake"
    )
    fb, grads, opt = phase_peaks(meas)
    tail = meas.tail_peaks[str(meas.run.steps)]["Total"]
    # Activation regime: the peak is at the start of backward, before most gradients exist.
    # At tiny micro-batches it moves to the end of backward (gradient-dominated), where the
    # optimizer-step peak covers it; those points say nothing about activations.
    activation_regime = grads < params * prec.gradients // 2
    step = opt - params * (prec.weights + prec.gradients + prec.optimizer)
    # Steady state also holds O: the analytic states plus AdamW's fp32 ``step`` scalar per
    # parameter tensor (batch-independent; it lands in the per-layer constants).
    fb_residual = fb - params * prec.weights + 4 * tensors
    tail_residual = tail - params * (prec.weights + prec.gradients) + 4 * tensors
    return _Point(fb_residual, activation_regime, step / params, tail_residual)


def _residuals(run: RunSpec, dense: int, moe: int) -> _Residuals:
    """Residuals of one reduced model at the smallest micro-batch b (1, 2, 4, ...) whose peaks
    are both activation-dominated, and its end-of-backward residuals at micro-batch 1 and 2."""
    r = run.model_copy(update={"model": reduced_spec(run.model, dense, moe)})
    params, tensors = _param_count(r)
    b, low, high = 1, _point(r, 1, params, tensors), _point(r, 2, params, tensors)
    tails = (low.tail, high.tail)
    while not (low.activation_regime and high.activation_regime) and b < MAX_MICRO_BATCH:
        b, low = 2 * b, high
        high = _point(r, 2 * b, params, tensors)
    return _Residuals(low.residual, high.residual, b, max(low.step, high.step), tails)


def _param_count(run: RunSpec) -> tuple[int, int]:
    """(parameters, parameter tensors) of the model of ``run``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dssup.runtime.reference.model import build_model

    with FakeTensorMode():
        ps = list(build_model(run).parameters())
        return sum(p.numel() for p in ps), len(ps)


def _fit(run: RunSpec) -> tuple[dict[str, tuple[int, int]], float]:
    """Slope and intercept per coefficient name at one recompute level (``end_of_backward``
    included), and t_opt."""
    has_dense, has_moe = kinds(run.model)
    base = (1, 0) if has_dense else (0, 1)
    points = {base: _residuals(run, *base)}
    if has_dense:
        points[(base[0] + 1, base[1])] = _residuals(run, base[0] + 1, base[1])
    if has_moe:
        points[(base[0], base[1] + 1)] = _residuals(run, base[0], base[1] + 1)
    # slope and intercept of the residual in b, from the points (b, r1) and (2b, r2)
    line = {k: ((v.high - v.low) // v.b, 2 * v.low - v.high) for k, v in points.items()}
    out: dict[str, tuple[int, int]] = {}
    if has_dense:
        d = line[(base[0] + 1, base[1])]
        out["dense"] = (d[0] - line[base][0], d[1] - line[base][1])
    if has_moe:
        mm = line[(base[0], base[1] + 1)]
        out["moe"] = (mm[0] - line[base][0], mm[1] - line[base][1])
    first = out["dense" if has_dense else "moe"]
    out["stage"] = (line[base][0] - first[0], line[base][1] - first[1])
    # The end-of-backward window holds the first layer and the embedding only: the one-layer
    # model's line is the stage's (the other models share its first layer).
    t1, t2 = points[base].tails
    out["end_of_backward"] = (t2 - t1, 2 * t1 - t2)
    t_opt = max(v.step for v in points.values())
    return out, t_opt


def calibrate(run: RunSpec) -> EagerProfile:
    """The eager profile of ``run``'s model, dtype and optimizer (micro-batch is ignored)."""
    fits = {level: _fit(run.model_copy(update={"recompute": level})) for level in LEVELS}
    names = fits["none"][0].keys() - {"end_of_backward"}

    def coef(name: str) -> LayerCoefficients:
        per = LevelBytes(**{lv: fits[lv][0][name][0] for lv in LEVELS})
        const = LevelBytes(**{lv: fits[lv][0][name][1] for lv in LEVELS})
        return LayerCoefficients(per_sample=per, constant=const)

    return EagerProfile(
        source=f"trace of {run.model.name} with torch {torch.__version__}, "
        f"{run.dtype}, AdamW {run.optimizer}, MoE {run.moe_routing} "
        f"(capacity factor {run.capacity_factor:g})",
        seq_len=run.seq_len,
        dtype=run.dtype,
        optimizer=run.optimizer,
        dense=coef("dense") if "dense" in names else None,
        moe=coef("moe") if "moe" in names else None,
        stage=coef("stage"),
        end_of_backward=coef("end_of_backward"),
        optimizer_transient_per_param=max(fits[lv][1] for lv in LEVELS),
    )
