"""Published training recipes, and how the planner does on them: the step-time validation.

Why: a step-time model is only worth its ranking if, for recipes whose throughput is published,
the published layout (which experts tuned) is predicted to fit, ranks near the top of what
``plan --search-parallelism`` enumerates for the same GPUs and global batch, and its predicted
tokens/s/GPU is near the published figure. The data (models, layouts, figures, sources) is in
``tests/fixtures/step_time/recipes.json``; the table is in docs/step-time.md.

Pure: the caller reads the JSON and passes the dicts in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dssup.errors import ConfigError
from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.memory.config import Framework, Layout, Precision, Recompute, Schedule, Training
from dssup.memory.cost import CostModel
from dssup.memory.frameworks import runnable_frameworks
from dssup.memory.gpus import find_gpu, usable_memory
from dssup.memory.plan import Candidate, PlanRequest, plan
from dssup.memory.spec import ModelSpec
from dssup.memory.splits import describe_split
from dssup.memory.topology import Topology, topology_for

__all__ = [
    "RECIPE_MARGIN",
    "Recipe",
    "RecipeResult",
    "evaluate_recipe",
    "load_recipes",
    "predict_published",
    "recipe_model",
    "recipe_request",
    "recipe_topology",
    "recipe_training",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_GiB = 1 << 30

#: The validation runs with ``plan``'s own defaults: no margin (capacity.py), the GPU's
#: CUDA-usable memory, no framework and no layer split given (the planner searches both). What
#: a recipe states about the job itself (sequence, precision, FP8, recompute modules, the
#: dispatcher, all-to-all overlap) is kept; the fixture's ``framework`` and
#: ``layers_per_stage`` record what the source published and are not handed to the planner.
RECIPE_MARGIN = DEFAULT_MARGIN


class Recipe(BaseModel):
    """One published run: the model, the machine, the layout and the published throughput."""

    model_config = _FROZEN
    name: str
    source: str = Field(description="key into the fixture's sources (repo, path, commit or paper)")
    model: str = Field(description="a Hub id of dssup's model registry or a dssup preset")
    gpu: str = Field(description="GPU table name")
    gpus: int = Field(gt=0)
    compute_dtype: Literal["bf16", "fp8"]
    global_batch: int = Field(gt=0, description="sequences per step")
    micro_batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    cp: int = Field(gt=0)
    vpp: int = Field(gt=0)
    ep: int = Field(gt=0)
    schedule: Schedule
    layers_per_stage: tuple[int, ...] | None = Field(
        None, description="the recipe's layer count per (virtual) stage; None: even split"
    )
    split_note: str = Field("", description="where layers_per_stage comes from")
    zero: int = Field(ge=0, le=3, description="distributed optimizer = 1, FSDP = 3")
    recompute: Recompute | None = Field(description="None: not published, dssup picks")
    precision: str = Field("bf16", description="Precision.named preset")
    cache_fp8: bool | None = Field(
        None,
        description="linear inputs cached in FP8 for backward; None: with FP8 GEMMs "
        "(TransformerEngine caches the FP8 cast it computes with)",
    )
    framework: Framework | None = Field(None, description="None: megatron")
    recompute_modules: tuple[str, ...] | None = Field(
        None, description="the recipe's Megatron --recompute-modules (selective)"
    )
    ep_dispatch: Literal["alltoall", "dedup"] = "alltoall"
    ep_overlap: bool = Field(False, description="the recipe overlaps the expert all-to-all")
    host_cores: int | None = None
    settings_source: str = Field(
        "", description="key into the sources for dispatcher/overlap/recompute settings"
    )
    unstated: tuple[str, ...] = ()
    published: float = Field(gt=0, description="tokens/s/GPU")
    published_note: str = ""
    fit: bool = Field(description="used to fit CostModel's fitted constants")
    fit_for: str | None = Field(None, description="the CostModel constant this recipe fits")

    def layout(self) -> Layout:
        """The published layout without its layer split (which the planner searches)."""
        return Layout(
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            vpp=self.vpp,
            ep=self.ep,
            dp=self.gpus // (self.tp * self.pp * self.cp),
            schedule=self.schedule,
        )


class RecipeResult(BaseModel):
    """What the planner predicts for one recipe."""

    model_config = _FROZEN
    name: str
    fits: bool = Field(
        description="the published layout has a config predicted to fit (plan's default options)"
    )
    peak_gib: float | None
    predicted_step_s: float | None = Field(
        description="the published config's step time, with its own split and framework"
    )
    predicted: float | None = Field(description="predicted tokens/s/GPU of the published config")
    published: float
    error: float | None = Field(description="predicted / published - 1")
    rank: int | None = Field(description="rank of its best config among all fitting configs")
    layout_rank: int | None = Field(description="rank of its layout among fitting layouts")
    best_step_s: float | None = Field(description="the best step time the search predicts")
    gap: float | None = Field(
        description="the published layout's fastest row in the search (step time) / best - 1"
    )
    best: str = Field(description="the search's best config, in words")
    framework: str = Field(
        "", description="the framework the planner ran the published layout with"
    )
    split: str = Field("", description="the layer split the planner chose for it")
    fitting: int
    evaluated: int
    fit: bool
    note: str = Field("", description="why the published layout could not be evaluated")


def load_recipes(
    doc: dict[str, Any], load: Callable[[str], ModelSpec]
) -> tuple[list[Recipe], dict[str, ModelSpec]]:
    """Recipes from the fixture's parsed JSON and their models, read by ``load`` (the caller's
    model loader, e.g. ``dssup.modelio.load_model``: registry Hub ids and presets)."""
    recipes = [Recipe.model_validate(r) for r in doc["recipes"]]
    return recipes, {r.model: load(r.model) for r in recipes}


def recipe_model(r: Recipe, models: dict[str, ModelSpec]) -> ModelSpec:
    """The recipe's model, as ``load_recipes`` read it."""
    return models[r.model]


def recipe_topology(r: Recipe) -> Topology:
    """The reference node of the recipe's GPU (with its host cores if the recipe gives them)."""
    spec = find_gpu(r.gpu)
    if spec is None:
        raise ConfigError("gpu", f"unknown GPU {r.gpu!r}", "use a GPU table name")
    return topology_for(spec, host_cpu_cores=r.host_cores)[0]


def recipe_training(r: Recipe, framework: bool = False) -> Training:
    """The base training of a recipe: sequence, precision (FP8 caching with FP8 GEMMs unless
    the recipe says otherwise) and recompute modules; ``framework``: also the published
    framework (the validation leaves it to the planner)."""
    cache = r.compute_dtype == "fp8" if r.cache_fp8 is None else r.cache_fp8
    return Training(
        seq_len=r.seq_len,
        precision=Precision.named(r.precision).model_copy(update={"cache_fp8": cache}),
        framework=r.framework if framework else None,
        recompute="selective" if r.recompute_modules else "none",
        recompute_modules=r.recompute_modules,
    )


def recipe_request(
    r: Recipe,
    m: ModelSpec,
    cm: CostModel,
    gpu_memory: int,
    search: bool,
    limit: int,
    published: bool = False,
) -> PlanRequest:
    """The plan of a recipe with ``plan``'s defaults (``published``: its own framework and
    layer split, for the throughput it published)."""
    base = r.layout()
    if published:
        base = base.model_copy(update={"layers_per_stage": r.layers_per_stage})
    pinned = not search
    return PlanRequest(
        model=m,
        gpu_memory_bytes=gpu_memory,
        margin=RECIPE_MARGIN,
        global_batch=r.global_batch,
        world_size=r.gpus,
        layout=base,
        training=recipe_training(r, framework=published),
        frameworks=None if published else runnable_frameworks(m),
        search_splits=not published,
        recompute=(r.recompute,) if pinned and r.recompute else ("none", "selective", "full"),
        zero_stages=(r.zero,) if pinned else (0, 1, 2, 3),
        offloads=("none",) if pinned else None,
        micro_batches=(r.micro_batch,) if pinned else None,
        search_parallelism=search,
        cost=cm.model_copy(
            update={
                "compute_dtype": r.compute_dtype,
                "ep_dispatch": r.ep_dispatch,
                "ep_overlap": r.ep_overlap,
            }
        ),
        topology=recipe_topology(r),
        limit=limit,
    )


def _same_layout(c: Candidate, r: Recipe) -> bool:
    lay = c.layout
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.schedule, lay.vpp, c.training.micro_batch) == (
        r.tp,
        r.pp,
        r.cp,
        r.ep,
        r.schedule,
        r.vpp,
        r.micro_batch,
    )


def _words(c: Candidate) -> str:
    lay, t = c.layout, c.training
    sched = f"vpp{lay.vpp}" if lay.schedule == "interleaved" else lay.schedule
    return (
        f"{t.framework or 'megatron'} TP{lay.tp} PP{lay.pp} {sched} {_split(lay)} EP{lay.ep} "
        f"CP{lay.cp} mb{t.micro_batch} {t.recompute} ZeRO{t.zero_stage} {c.step_time_s:.2f}s"
    )


def _capacity(r: Recipe) -> int:
    """What CUDA can allocate on the recipe's GPU (``gpus.usable_memory``)."""
    spec = find_gpu(r.gpu)
    if spec is None:
        raise ConfigError("gpu", f"unknown GPU {r.gpu!r}", "use a GPU table name")
    return usable_memory(spec)


def _split(lay: Layout) -> str:
    if lay.pp == 1:
        return "-"
    return "even" if lay.layers_per_stage is None else describe_split(lay.layers_per_stage)


def _refused(r: Recipe, why: str) -> RecipeResult:
    return RecipeResult(
        name=r.name,
        fits=False,
        peak_gib=None,
        predicted_step_s=None,
        predicted=None,
        published=r.published,
        error=None,
        rank=None,
        layout_rank=None,
        best_step_s=None,
        gap=None,
        best="-",
        fitting=0,
        evaluated=0,
        fit=r.fit,
        note=why,
    )


def predict_published(r: Recipe, models: dict[str, ModelSpec], cm: CostModel) -> float | None:
    """Predicted tokens/s/GPU of the published config (None: it is not predicted to fit)."""
    m = recipe_model(r, models)
    own = plan(recipe_request(r, m, cm, _capacity(r), False, 1, published=True))
    if not own.candidates:
        return None
    return r.global_batch * r.seq_len / own.candidates[0].step_time_s / r.gpus


def evaluate_recipe(
    r: Recipe, models: dict[str, ModelSpec], cm: CostModel, limit: int = 200_000
) -> RecipeResult:
    """Whether the published layout fits with ``plan``'s default options (the planner choosing
    framework and split), its rank in the default parallelism search, and the predicted
    throughput of the published config as published (its own split and framework)."""
    m = recipe_model(r, models)
    gpu_memory = _capacity(r)
    try:
        own = plan(recipe_request(r, m, cm, gpu_memory, False, 1))
        as_run = plan(recipe_request(r, m, cm, gpu_memory, False, 1, published=True))
    except (ConfigError, ValidationError) as exc:  # a layout the memory model cannot express
        return _refused(r, str(exc).splitlines()[1 if isinstance(exc, ValidationError) else 0])
    tokens = r.global_batch * r.seq_len
    found = own.candidates[0] if own.candidates else None
    step = as_run.candidates[0].step_time_s if as_run.candidates else None
    search = plan(recipe_request(r, m, cm, gpu_memory, True, limit))
    cands = search.candidates
    rank = next((i for i, c in enumerate(cands, 1) if _same_layout(c, r)), None)
    mine_s = cands[rank - 1].step_time_s if rank is not None else None
    layouts: list[tuple[object, ...]] = []
    for c in cands:
        key = (c.layout.tp, c.layout.pp, c.layout.ep, c.layout.schedule, c.layout.vpp)
        if key not in layouts:
            layouts.append(key)
    mine = (r.tp, r.pp, r.ep, r.schedule, r.vpp)
    best = cands[0].step_time_s if cands else None
    return RecipeResult(
        name=r.name,
        fits=found is not None,
        peak_gib=None if found is None else round(found.peak_bytes / _GiB, 2),
        predicted_step_s=step,
        predicted=None if step is None else tokens / step / r.gpus,
        published=r.published,
        error=None if step is None else tokens / step / r.gpus / r.published - 1,
        rank=rank,
        layout_rank=layouts.index(mine) + 1 if mine in layouts else None,
        best_step_s=best,
        gap=None if mine_s is None or best is None else mine_s / best - 1,
        best=_words(cands[0]) if cands else "nothing fits",
        framework=found.training.framework or "megatron" if found is not None else "",
        split=_split(found.layout) if found is not None else "",
        fitting=search.fitting,
        evaluated=search.evaluated,
        fit=r.fit,
    )
