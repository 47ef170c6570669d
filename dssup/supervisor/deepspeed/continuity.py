"""Did the resumed run continue the loss curve, or did the recovery silently damage training?

A conversion that drops the Adam moments, a load that reads the wrong shard, or a changed
global batch show up as a jump in the loss right after the resume. After every resume with a
changed config, dssup compares the first losses with what came before and journals the
verdict; a jump beyond the tolerance is a *failed recovery*, never accepted silently.

Two comparisons, both pure:

* **re-done steps**: steps after the checkpoint that the failed attempt had already run are run
  again from the same weights on the same samples; their losses must agree within
  ``redo_rtol`` (default 1e-3: a new ZeRO stage or micro-batch only changes rounding);
* **trend**: the mean of the first ``after_window`` new losses must lie within the band around
  the straight-line fit of the last ``before_window`` losses: ``max(rtol × |expected|,
  noise_k × residual std)`` (defaults 0.25 and 3).

Global samples must advance without gap or repeat: the first resumed step ends at the
checkpoint's samples plus one global batch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from statistics import fmean, pstdev
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ContinuityRecord", "LossPoint", "check_continuity", "parse_loss_lines"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_JSON_LINE = re.compile(r"DSSUP_DS (\{.*\})\s*$")
_TEXT_LINE = re.compile(r"\bstep[ =:]+(\d+)\b.*?\bloss[ =:]+([-+0-9.eE]+|nan|inf)", re.IGNORECASE)


class LossPoint(BaseModel):
    """One optimizer step's loss as the training script reported it."""

    model_config = _FROZEN
    step: int = Field(ge=0, description="optimizer steps completed after this one")
    loss: float = Field(description="mean loss of the step's global batch")
    global_samples: int | None = Field(None, ge=0, description="samples consumed after it")


class ContinuityRecord(BaseModel):
    """The journal entry for one resume."""

    model_config = _FROZEN
    verdict: Literal["continuous", "jump", "sample-gap", "insufficient-data"]
    ok: bool = Field(description="False means the recovery failed")
    resumed_at_step: int = Field(description="the checkpoint's global steps")
    redo_steps: int = Field(0, description="steps compared one to one")
    redo_max_rel_diff: float | None = Field(None, description="largest relative difference")
    expected: float | None = Field(None, description="trend value at the first new steps")
    observed: float | None = Field(None, description="mean of the first new losses")
    band: float | None = Field(None, description="allowed |observed - expected|")
    samples_expected: int | None = Field(None, description="samples after the first new step")
    samples_observed: int | None = None
    detail: str = Field("", description="one sentence for the journal and the log")


def parse_loss_lines(text: str) -> list[LossPoint]:
    """Losses from a script's output: ``DSSUP_DS {"event": "step", ...}`` lines (the format
    examples/deepspeed/train_ds.py prints), else ``step N ... loss X`` text lines."""
    points: list[LossPoint] = []
    for line in text.splitlines():
        if m := _JSON_LINE.search(line):
            doc = json.loads(m.group(1))
            if doc.get("event") == "step":
                points.append(
                    LossPoint.model_validate({k: doc.get(k) for k in LossPoint.model_fields})
                )
        elif m := _TEXT_LINE.search(line):
            points.append(LossPoint(step=int(m.group(1)), loss=float(m.group(2))))
    return points


def _fit(points: Sequence[LossPoint]) -> tuple[float, float, float]:
    """Least-squares line (slope, intercept) and residual std."""
    xs, ys = [p.step for p in points], [p.loss for p in points]
    mx, my = fmean(xs), fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    icpt = my - slope * mx
    resid = [y - (slope * x + icpt) for x, y in zip(xs, ys, strict=True)]
    return slope, icpt, pstdev(resid) if len(resid) > 1 else 0.0


def _redo(before: dict[int, float], after: Sequence[LossPoint]) -> tuple[int, float | None]:
    diffs = [
        abs(p.loss - before[p.step]) / max(abs(before[p.step]), 1e-12)
        for p in after
        if p.step in before
    ]
    return len(diffs), (max(diffs) if diffs else None)


def check_continuity(
    before: Sequence[LossPoint],
    after: Sequence[LossPoint],
    resumed_at_step: int,
    *,
    checkpoint_samples: int | None = None,
    global_batch: int | None = None,
    before_window: int = 5,
    after_window: int = 3,
    rtol: float = 0.25,
    noise_k: float = 3.0,
    redo_rtol: float = 1e-3,
) -> ContinuityRecord:
    """Compare the losses after a resume with those before the failure (see module doc)."""
    base = {"resumed_at_step": resumed_at_step}
    after = sorted(after, key=lambda p: p.step)
    if after and checkpoint_samples is not None and global_batch is not None:
        first = after[0]
        want = checkpoint_samples + (first.step - resumed_at_step) * global_batch
        if first.global_samples is not None and first.global_samples != want:
            return ContinuityRecord(
                verdict="sample-gap", ok=False, samples_expected=want,
                samples_observed=first.global_samples, **base,
                detail=f"step {first.step} ended at sample {first.global_samples}, expected {want}",
            )  # fmt: skip
    if any(not math.isfinite(p.loss) for p in after):
        return ContinuityRecord(
            verdict="jump", ok=False, detail="non-finite loss after resume", **base
        )
    by_step = {p.step: p.loss for p in before}
    n_redo, worst = _redo(by_step, after)
    if worst is not None and worst > redo_rtol:
        return ContinuityRecord(
            verdict="jump", ok=False, redo_steps=n_redo, redo_max_rel_diff=worst, **base,
            detail=f"re-done steps differ by up to {worst:.3g} (relative), tolerance {redo_rtol}",
        )  # fmt: skip
    history = sorted(before, key=lambda p: p.step)  # the whole pre-failure curve
    fresh = [p for p in after if p.step not in by_step][:after_window]
    if len(history) < 2 or not fresh:
        ok = n_redo > 0
        detail = (
            f"{n_redo} re-done steps agree within {redo_rtol}"
            if ok
            else "too few losses on one side to judge"
        )
        return ContinuityRecord(
            verdict="continuous" if ok else "insufficient-data", ok=ok, redo_steps=n_redo,
            redo_max_rel_diff=worst, detail=detail, **base,
        )  # fmt: skip
    slope, icpt, noise = _fit(history[-before_window:])
    expected = fmean(slope * p.step + icpt for p in fresh)
    observed = fmean(p.loss for p in fresh)
    band = max(rtol * abs(expected), noise_k * noise)
    ok = abs(observed - expected) <= band
    return ContinuityRecord(
        verdict="continuous" if ok else "jump", ok=ok, redo_steps=n_redo,
        redo_max_rel_diff=worst, expected=expected, observed=observed, band=band, **base,
        detail=(
            f"first {len(fresh)} new losses average {observed:.4g}; trend predicts "
            f"{expected:.4g} ± {band:.3g}" + ("" if ok else ": LOSS JUMP, recovery failed")
        ),
    )  # fmt: skip
