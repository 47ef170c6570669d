"""Fit the step-time model's three fitted constants on the recipes marked ``fit``.

Run: .venv/bin/python bench/fit_step_time.py
Every other constant of ``CostModel`` has a source (docs/step-time.md). Three have none that
fits end-to-end training, so they are fitted, each on the recipes whose ``fit_for`` names it
(tests/fixtures/step_time/recipes.json): ``fp8_gemm_efficiency`` on dense FP8 recipes,
``gemm_efficiency`` on the BF16 one, ``moe_slot_seconds`` on fine-grained MoE recipes. Each
minimises the squared log error of predicted against published tokens/s/GPU over its recipes,
by golden-section search, in turns until none moves (they interact: an MoE recipe's GEMMs run at
the GEMM efficiency). The held-out recipes are never used; bench/step_time_validation.py
reports both sets. The printed values, rounded, are CostModel's defaults.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dssup.memory.cost import CostModel
from dssup.memory.recipes import Recipe, load_recipes, predict_published
from dssup.memory.spec import ModelSpec
from dssup.modelio import load_model

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/step_time/recipes.json"
RANGE = {
    "fp8_gemm_efficiency": (0.1, 1.0),
    "gemm_efficiency": (0.1, 1.0),
    "moe_slot_seconds": (0.0, 1e-9),
}


def loss(
    base: CostModel, field: str, value: float, rows: list[Recipe], models: dict[str, ModelSpec]
) -> float:
    cm = base.model_copy(update={field: value})
    total = 0.0
    for r in rows:
        got = predict_published(r, models, cm)
        total += 1e6 if got is None else math.log(got / r.published) ** 2
    return total


def golden(base: CostModel, field: str, rows: list[Recipe], models: dict[str, ModelSpec]) -> float:
    """Golden-section search over the constant's range (the loss is unimodal in it)."""
    lo, hi = RANGE[field]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(base, field, a, rows, models), loss(base, field, b, rows, models)
    while hi - lo > 1e-3 * (RANGE[field][1] - RANGE[field][0]):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(base, field, a, rows, models)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(base, field, b, rows, models)
    return (lo + hi) / 2


def main() -> None:
    recipes, models = load_recipes(json.loads(FIXTURE.read_text()), load_model)
    cm = CostModel()
    for turn in range(4):
        moved = 0.0
        for field in RANGE:
            rows = [r for r in recipes if r.fit and r.fit_for == field]
            value = golden(cm, field, rows, models)
            old = getattr(cm, field)
            moved = max(moved, abs(value - old) / max(abs(old), 1e-12))
            cm = cm.model_copy(update={field: value})
        print(f"turn {turn + 1}: " + ", ".join(f"{f} = {getattr(cm, f):.4g}" for f in RANGE))
        if moved < 0.01:
            break
    for field in RANGE:
        names = ", ".join(r.name for r in recipes if r.fit and r.fit_for == field)
        print(f"{field} = {getattr(cm, field):.4g}, fitted on {names}")


if __name__ == "__main__":
    main()
