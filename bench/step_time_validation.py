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

from dssup.memory.config import Overheads
from dssup.memory.core import prepare, states
from dssup.memory.cost import CostModel
from dssup.memory.curve import cost_curve, cost_terms
from dssup.memory.defaults import resolve
from dssup.memory.recipes import (
    Recipe,
    RecipeResult,
    evaluate_recipe,
    load_recipes,
    recipe_model,
    recipe_topology,
    recipe_training,
)
from dssup.memory.spec import ModelSpec
from dssup.memory.steptime import fold_layout, recompute_spec
from dssup.modelio import load_model

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/step_time/recipes.json"


def results(cm: CostModel | None = None) -> list[RecipeResult]:
    recipes, models = load_recipes(json.loads(FIXTURE.read_text()), load_model)
    return [evaluate_recipe(r, models, cm or CostModel()) for r in recipes]


def step_time_alone(r: Recipe, models: dict[str, ModelSpec], cm: CostModel) -> float:
    """Predicted tokens/s/GPU of the published config by the step-time model alone, for layouts
    the memory model refuses or does not fit: the layout's work and traffic as the planner folds
    them, with the memory model's parameters and activations of the same layout without VPP
    (which the memory model cannot split per virtual stage yet), virtual stages split evenly
    (the recipe's own split differs by one layer at the ends). Documentation only."""
    m, topo = recipe_model(r, models), recipe_topology(r)
    lay = r.model_copy(update={"layers_per_stage": None}).layout()  # even split: see docstring
    mm = r.global_batch // (lay.dp * r.micro_batch)
    rc = r.recompute or "selective"
    t = recipe_training(r, framework=True).model_copy(
        update={
            "micro_batch": r.micro_batch,
            "grad_accum": mm,
            "zero_stage": r.zero,
            "recompute": rc,
        }
    )
    flat = lay.model_copy(update={"vpp": 1, "schedule": "1f1b"}) if lay.vpp > 1 else lay
    res = resolve("megatron", t, Overheads())
    stages = prepare(m, flat, t, "megatron", res)
    c = cm.model_copy(
        update={
            "compute_dtype": r.compute_dtype,
            "ep_dispatch": r.ep_dispatch,
            "ep_overlap": r.ep_overlap,
        }
    )
    lc = fold_layout(
        c,
        topo,
        m,
        lay,
        r.seq_len,
        stages,
        res.precision,
        recompute=recompute_spec(res),
        framework=res.framework,
    )
    shard = max(states(st, flat, t, "megatron", res, Overheads()).ms.shard_params for st in stages)
    curve = cost_curve(c, lc, rc, r.zero, False, False, shard, res.precision)
    step = cost_terms(curve, r.micro_batch, mm)["total"]
    return r.global_batch * r.seq_len / step / r.gpus


def alone(cm: CostModel | None = None) -> str:
    recipes, models = load_recipes(json.loads(FIXTURE.read_text()), load_model)
    lines = ["step time alone for the published layouts the memory model cannot place yet:"]
    for r, res in zip(recipes, results(cm), strict=True):
        if not res.fits:
            tps = step_time_alone(r, models, cm or CostModel())
            lines.append(
                f"  {r.name}: {tps:,.0f} tokens/s/GPU predicted, {r.published:,.0f} published "
                f"({tps / r.published - 1:+.0%}){'; ' + res.note if res.note else ''}"
            )
    return "\n".join(lines)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(rows: list[RecipeResult]) -> str:
    head = (
        "| recipe | set | fits | framework, split | peak GiB | predicted step s | predicted "
        "tok/s/GPU | published | error | rank (configs) | rank (layouts) | vs best | dssup's "
        "best |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r.name} | {'fit' if r.fit else 'held out'} | {'yes' if r.fits else 'NO'} | "
            f"{r.framework}, {r.split} | {_fmt(r.peak_gib, '.1f')} | {_fmt(r.predicted_step_s, '.2f')} | "
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
    print(alone())
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
