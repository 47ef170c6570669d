"""``dssup plan``: the configs that fit a GPU, fastest first, global batch exact."""

from __future__ import annotations

import json
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.explain import render_explain
from dssup.cli.hardware import build_cost, build_topology, hardware_options
from dssup.cli.implied import imply
from dssup.cli.options import (
    build_layout,
    build_overheads,
    build_training,
    given_params,
    host_inputs,
    layout_options,
    margin_option,
    model_options,
    overhead_options,
    training_options,
)
from dssup.cli.render_plan import capacity_note, render_plan
from dssup.cli.values import BATCH, COUNT, DEGREE, GPUS
from dssup.errors import ConfigError
from dssup.memory import ModelSpec, PlanRequest, plan
from dssup.memory.frameworks import runnable_frameworks
from dssup.memory.gpus import parse_size
from dssup.modelio import load_model

__all__ = ["plan_cmd"]

_PINS = {"tp": "tp", "pp": "pp", "ep": "ep", "schedule": "schedule", "vpp": "vpp"}


@main.command("plan")
@model_options
@click.option(
    "--gpus",
    "--world-size",
    "world_size",
    type=GPUS,
    default=None,
    help="Total GPUs.",
)
@click.option(
    "--nnodes",
    default=None,
    help="Node range MIN:MAX instead of --gpus: print the elastic table (see plan-elastic).",
)
@click.option(
    "--nproc-per-node",
    type=DEGREE,
    default=1,
    show_default=True,
    help="With --nnodes.",
)
@click.option(
    "--global-batch-size",
    type=BATCH,
    required=True,
    help="Sequences per optimizer step; every plan keeps it exact.",
)
@layout_options
@training_options
@overhead_options
@hardware_options
@click.option(
    "--search-parallelism/--fixed-layout",
    default=True,
    show_default=True,
    help="Vary TP (powers of two up to --max-tp), PP, EP, the pipeline schedule (1F1B, "
    "interleaved VPP, DualPipe for MoE) and the layer split (the default); --tp/--pp/--ep/"
    "--schedule/--vpp given explicitly pin it. --fixed-layout: only the given layout.",
)
@click.option(
    "--exhaustive",
    is_flag=True,
    help="Sweep every layout's memory (exact counts of what fits; slower). Default: rank the "
    "printed rows by a step-time lower bound and skip layouts that cannot reach them.",
)
@click.option(
    "--max-tp",
    type=DEGREE,
    default=8,
    show_default=True,
    help="Largest TP to consider.",
)
@click.option("--no-offload", is_flag=True, help="Never propose optimizer or parameter offload.")
@click.option("--zero-stages", default=None, help="ZeRO stages allowed (default 0,1,2,3).")
@margin_option
@click.option("--top", type=COUNT, default=10, show_default=True, help="Rows to print.")
@click.option(
    "--explain",
    type=COUNT,
    default=None,
    help="Print the step-time breakdown of row N (every term, every hardware figure).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def plan_cmd(
    search_parallelism: bool,
    exhaustive: bool,
    max_tp: int,
    no_offload: bool,
    zero_stages: str | None,
    margin: float,
    top: int,
    explain: int | None,
    as_json: bool,
    **o: Any,
) -> None:
    """Rank the configs that fit by predicted step time (docs/step-time.md).

    \b
    Varies micro-batch with the matching gradient accumulation (micro x accum x DP = global
    batch, always), recompute, ZeRO stage, offload, TP, PP, EP, the schedule, the layer split
    (Megatron's account-for-embedding/loss and first/last-stage counts) and, with no
    --framework, the frameworks that run the model (Megatron; DeepSeek's own code, with
    DualPipe, for DeepSeek-V2/V3-class models): every row names its framework and split. A
    searched option you give pins the search: --micro-batch, --recompute, --zero, --offload,
    --tp, --pp, --ep, --schedule, --vpp, --framework; --layers-per-stage is the split of the
    layouts with its own PP (its entries, divided by --vpp). --grad-accum follows from the
    global batch and is refused here. Fit is judged against what CUDA can allocate on the GPU;
    rows marked 'near' are within the memory model's uncertainty of it. Step times are for the
    GPU's reference node (dssup gpus); every figure and assumption is printed.

    \b
    Examples:
      dssup plan --model deepseek-v3 --gpus 2048 --gpu-memory H800 \\
          --global-batch-size 15360 --precision fp8 --dtypes moments=bf16 \\
          --ep-dispatch dedup --top 5 --explain 1   # DeepSeek-V3 as trained: FP8, BF16 moments
      dssup plan --model llama-3-70b --gpus 64 --global-batch-size 512 --gpu-memory H100 \\
          --host-memory 2TiB      # offload only where the node's host memory holds it
      dssup plan --model llama-3-8b --gpus 8 --global-batch-size 64 --gpu-memory H100 \\
          --fixed-layout --tp 1   # only the given layout: micro-batch, recompute, ZeRO, offload
    Exit status: 0 something fits, 1 nothing fits, 2 bad input.
    """
    if o["nnodes"] is not None:
        _elastic(o, margin, as_json)
        return
    if o["world_size"] is None:
        raise ConfigError("--gpus", "required for planning", "pass --gpus N (or --nnodes MIN:MAX)")
    if not o["gpu_memory"]:
        raise ConfigError("--gpu-memory", "required for planning", "pass e.g. --gpu-memory H100")
    given = given_params()
    notes = imply(o, given, "plan")
    if "grad_accum" in given:
        raise ConfigError(
            "--grad-accum",
            "plan derives it from --global-batch-size, the micro-batch and DP",
            "drop it; pass --micro-batch to pin the micro-batch",
        )
    stages = _stages(zero_stages, o["zero"] if "zero" in given else None)
    offloads: tuple[str, ...] | None = None
    if "offload" in given:
        offloads = ({"params": "both"}.get(o["offload"], o["offload"]),)
        if no_offload and offloads != ("none",):
            raise ConfigError("--offload", "conflicts with --no-offload", "pass only one of them")
    topo, warnings = build_topology(o)
    del o["nnodes"], o["nproc_per_node"]
    host = host_inputs(o, o.get("gpu_name"))  # --gpu names the node, like the step times
    model = load_model(o["model"], o.get("approximate_as"))
    frameworks = None if "framework" in given else runnable_frameworks(model)
    notes += _search_notes(model, frameworks, o, search_parallelism)
    req = PlanRequest(
        model=model,
        gpu_memory_bytes=parse_size(o["gpu_memory"], "--gpu-memory"),
        global_batch=o["global_batch_size"],
        world_size=o["world_size"],
        layout=build_layout(o, 1),
        training=build_training({**o, "zero": 0, "offload": "none", "recompute": "none"}, 1),
        overheads=build_overheads(o),
        convention=o["convention"],
        recompute=(o["recompute"],) if "recompute" in given else ("none", "selective", "full"),
        zero_stages=stages,
        allow_offload=not no_offload,
        offloads=offloads,
        micro_batches=(o["micro_batch"],) if "micro_batch" in given else None,
        search_parallelism=search_parallelism,
        search_splits=True,
        frameworks=frameworks,
        bound=not exhaustive,
        fixed=tuple(_PINS[k] for k in _PINS if k in given) if search_parallelism else (),
        max_tp=max_tp,
        margin=margin,
        cost=build_cost(o),
        topology=topo,
        limit=max(top, explain or 0),
        host_memory_bytes=host.memory,
        gpus_per_node=topo.gpus_per_node,
    )
    res = plan(req)
    res = res.model_copy(update={"warnings": warnings + res.warnings})
    if explain is not None and explain > len(res.candidates):
        raise ConfigError(
            "--explain",
            f"row {explain} does not exist ({len(res.candidates)} rows fit)",
            f"pick a row from 1 to {len(res.candidates)}" if res.candidates else "nothing fits",
        )
    needed = any(c.host_bytes_per_node for c in res.candidates) or bool(res.host_limited)
    notes += host._replace(per_node=topo.gpus_per_node).notes(needed)
    notes.insert(0, capacity_note(o["gpu_memory"], margin))
    if as_json:
        doc = {**res.model_dump(mode="json"), "assumptions": notes}
        click.echo(json.dumps(doc, separators=(",", ":")))
    else:
        click.echo(render_plan(res, top, margin))
        if explain is not None:
            click.echo(render_explain(res, explain, req.cost))
        click.echo("assumptions:")
        click.echo("\n".join(f"  - {n}" for n in notes))
    if not res.candidates:
        raise SystemExit(1)


def _search_notes(
    model: ModelSpec, frameworks: tuple[str, ...] | None, o: dict[str, Any], searched: bool
) -> list[str]:
    """What the search assumed about frameworks and layer splits, in words."""
    out = []
    if frameworks is None:
        out.append(f"framework {o['framework']} (--framework pins it)")
    elif len(frameworks) > 1:
        out.append(
            f"frameworks {', '.join(frameworks)} (no --framework): {model.name} runs under "
            "Megatron-Core (1F1B, interleaved) and DeepSeek's own code (DualPipe, which "
            "Megatron-Core does not have); each row names its own; --framework pins one"
        )
    else:
        out.append(f"framework {frameworks[0]} (no --framework: the one that runs {model.name})")
    if o.get("layers_per_stage"):
        out.append("layer split: --layers-per-stage for its PP; other PPs searched as below")
    out.append(
        "layer splits searched for every PP (Megatron --account-for-embedding-in-pipeline-"
        "split / --account-for-loss-in-pipeline-split, --decoder-first/last-pipeline-num-"
        "layers, and the even split); each row keeps its fastest and names it"
    )
    if not searched:
        out.append("layout fixed (--fixed-layout): only micro-batch, recompute, ZeRO, offload")
    return out


def _stages(text: str | None, pinned: int | None) -> tuple[int, ...]:
    """``--zero-stages`` read and checked; ``--zero N`` pins it (both: they must agree)."""
    if text is None:
        return (pinned,) if pinned is not None else (0, 1, 2, 3)
    try:
        stages = tuple(int(z) for z in text.split(","))
    except ValueError as exc:
        raise ConfigError("--zero-stages", f"cannot read {text!r}", "write e.g. 0,1,2,3") from exc
    bad = [z for z in stages if z not in (0, 1, 2, 3)]
    if bad:
        raise ConfigError(
            "--zero-stages", f"{bad[0]} is not a ZeRO stage", "use stages from 0,1,2,3"
        )
    if pinned is not None and stages != (pinned,):
        raise ConfigError(
            "--zero", f"--zero {pinned} conflicts with --zero-stages {text}", "pass only one"
        )
    return tuple(dict.fromkeys(stages))


def _elastic(o: dict[str, Any], margin: float, as_json: bool) -> None:
    """``--nnodes MIN:MAX``: the global-batch table of ``dssup plan-elastic``."""
    from dssup.cli.elastic import capacity_notes, plan_elastic, render_table

    table = plan_elastic({**o, "margin": margin})
    if as_json:
        click.echo(json.dumps(table.model_dump(mode="json"), separators=(",", ":")))
    else:
        click.echo(render_table(table, capacity_notes({**o, "margin": margin})))
    if not table.compatible_nnodes:
        raise SystemExit(1)
