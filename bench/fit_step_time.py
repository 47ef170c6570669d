"""Fit the step-time model's two GEMM efficiencies on the recipes marked ``fit``.

Run: .venv/bin/python bench/fit_step_time.py
Every other constant of ``CostModel`` has a source (docs/step-time.md). ``gemm_efficiency``
(BF16) and ``fp8_gemm_efficiency`` have none that fits end-to-end training (a GEMM
microbenchmark is not a training step), so they are fitted: each minimises the squared log error
of predicted against published tokens/s/GPU over the fitting recipes of its precision
(tests/fixtures/step_time/recipes.json, ``"fit": true``). The held-out recipes are never used;
bench/step_time_validation.py reports both sets. The printed values, rounded to two digits,
are CostModel's defaults.
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
FIELD = {"bf16": "gemm_efficiency", "fp8": "fp8_gemm_efficiency"}


def loss(field: str, value: float, rows: list[Recipe], models: dict[str, ModelSpec]) -> float:
    cm = CostModel.model_validate({field: value})
    total = 0.0
    for r in rows:
        got = predict_published(r, models, cm)
        total += 1e6 if got is None else math.log(got / r.published) ** 2
    return total


def golden(field: str, rows: list[Recipe], models: dict[str, ModelSpec]) -> float:
    """Golden-section search on [0.1, 1.0] (the loss is unimodal: one efficiency scales time)."""
    lo, hi = 0.1, 1.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(field, a, rows, models), loss(field, b, rows, models)
    while hi - lo > 1e-3:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(field, a, rows, models)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(field, b, rows, models)
    return (lo + hi) / 2


def main() -> None:
    recipes, models = load_recipes(json.loads(FIXTURE.read_text()), load_model)
    for dtype, field in FIELD.items():
        rows = [r for r in recipes if r.fit and r.compute_dtype == dtype]
        value = golden(field, rows, models)
        names = ", ".join(r.name for r in rows)
        print(f"{field} = {value:.3f} (rounded {round(value, 2)}), fitted on {names}")


if __name__ == "__main__":
    main()
