"""The step-time validation table: published recipes against dssup's predictions.

Run: .venv/bin/python bench/step_time_validation.py [--markdown]
For each recipe in tests/fixtures/step_time/recipes.json: whether the published layout is
predicted to fit, its predicted tokens/s/GPU against the published figure, and its rank among
the fitting configs ``plan --search-parallelism`` enumerates for the same GPUs and global batch.
docs/step-time.md holds the printed table (the test checks the acceptance bounds).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dssup.memory.cost import CostModel
from dssup.memory.recipes import RecipeResult, evaluate_recipe, load_recipes

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/step_time/recipes.json"


def results(cm: CostModel | None = None) -> list[RecipeResult]:
    recipes, models = load_recipes(json.loads(FIXTURE.read_text()))
    return [evaluate_recipe(r, models, cm or CostModel()) for r in recipes]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(rows: list[RecipeResult]) -> str:
    head = (
        "| recipe | set | fits | peak GiB | predicted step s | predicted tok/s/GPU | published "
        "| error | rank (configs) | rank (layouts) | vs best | dssup's best |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r.name} | {'fit' if r.fit else 'held out'} | {'yes' if r.fits else 'NO'} | "
            f"{_fmt(r.peak_gib, '.1f')} | {_fmt(r.predicted_step_s, '.2f')} | "
            f"{_fmt(r.predicted, ',.0f')} | {r.published:,.0f} | {_fmt(r.error, '+.0%')} | "
            f"{r.rank or '-'} of {r.fitting} | {r.layout_rank or '-'} | "
            f"{_fmt(r.gap, '+.1%')} | {r.best} |"
        )
    return "\n".join(lines)


def summary(rows: list[RecipeResult]) -> str:
    def share(sel: list[RecipeResult]) -> str:
        ok = sum(1 for r in sel if r.error is not None and abs(r.error) <= 0.30)
        return f"{ok}/{len(sel)}"

    held = [r for r in rows if not r.fit]
    fitted = [r for r in rows if r.fit]
    ranked = sum(1 for r in rows if r.fits and ((r.rank or 10**9) <= 5 or (r.gap or 1) <= 0.10))
    return (
        f"within +-30 %: {share(rows)} all, {share(fitted)} fitted, {share(held)} held out; "
        f"published layout fits and ranks top 5 or within 10 % of the best: {ranked}/{len(rows)}"
    )


if __name__ == "__main__":
    t0 = time.perf_counter()
    rows = results()
    print(markdown(rows))
    print(summary(rows))
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
