"""``dssup plan``: the configs that fit a GPU, cheapest first, global batch exact."""

from __future__ import annotations

import json
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.options import (
    build_layout,
    build_overheads,
    build_training,
    host_inputs,
    layout_options,
    model_options,
    overhead_options,
    training_options,
)
from dssup.cli.render import render_plan
from dssup.errors import ConfigError
from dssup.memory import PlanRequest, plan
from dssup.memory.gpus import parse_size
from dssup.modelio import load_model

__all__ = ["plan_cmd"]


@main.command("plan")
@model_options
@click.option("--gpus", "--world-size", "world_size", type=int, default=None, help="Total GPUs.")
@click.option(
    "--nnodes",
    default=None,
    help="Node range MIN:MAX instead of --gpus: print the elastic table (see plan-elastic).",
)
@click.option("--nproc-per-node", type=int, default=1, show_default=True, help="With --nnodes.")
@click.option(
    "--global-batch-size",
    type=int,
    required=True,
    help="Sequences per optimizer step; every plan keeps it exact.",
)
@layout_options
@training_options
@overhead_options
@click.option(
    "--search-parallelism",
    is_flag=True,
    help="Also vary TP (powers of two up to --max-tp), PP and EP.",
)
@click.option("--max-tp", type=int, default=8, show_default=True, help="Largest TP to consider.")
@click.option("--no-offload", is_flag=True, help="Never propose optimizer or parameter offload.")
@click.option("--zero-stages", default="0,1,2,3", show_default=True, help="ZeRO stages allowed.")
@click.option(
    "--margin",
    type=float,
    default=0.05,
    show_default=True,
    help="Fraction of GPU memory kept free.",
)
@click.option("--top", type=int, default=10, show_default=True, help="Rows to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def plan_cmd(
    search_parallelism: bool,
    max_tp: int,
    no_offload: bool,
    zero_stages: str,
    margin: float,
    top: int,
    as_json: bool,
    **o: Any,
) -> None:
    """Rank the configs that fit, by an explicit cost model (docs/memory-model.md).

    \b
    Varies micro-batch with the matching gradient accumulation (micro x accum x DP = global
    batch, always), recompute, ZeRO stage and offload; with --search-parallelism also TP/PP/EP.
    The flags --micro-batch, --recompute, --zero and --offload are ignored here (searched).

    \b
    Examples:
      dssup plan --model deepseek-v3 --gpus 1024 --global-batch-size 1024 --gpu-memory H100 \\
          --tp 2 --pp 16 --ep 8
      dssup plan --model llama-3-70b --gpus 64 --global-batch-size 512 --gpu-memory H100 \\
          --host-memory 2TiB      # offload only where the node's host memory holds it
    Exit status: 0 something fits, 1 nothing fits, 2 bad input.
    """
    if o["nnodes"] is not None:
        _elastic(o, margin, as_json)
        return
    if o["world_size"] is None:
        raise ConfigError("--gpus", "required for planning", "pass --gpus N (or --nnodes MIN:MAX)")
    if not o["gpu_memory"]:
        raise ConfigError("--gpu-memory", "required for planning", "pass e.g. --gpu-memory 80GiB")
    try:
        stages = tuple(int(z) for z in zero_stages.split(","))
    except ValueError as exc:
        raise ConfigError(
            "--zero-stages", f"cannot read {zero_stages!r}", "write e.g. 0,1,2,3"
        ) from exc
    del o["nnodes"], o["nproc_per_node"]
    host, per_node, source = host_inputs(o)
    req = PlanRequest(
        model=load_model(o["model"], o.get("approximate_as")),
        gpu_memory_bytes=parse_size(o["gpu_memory"], "--gpu-memory"),
        global_batch=o["global_batch_size"],
        world_size=o["world_size"],
        layout=build_layout(o, 1),
        training=build_training({**o, "zero": 0, "offload": "none"}, 1),
        overheads=build_overheads(o),
        convention=o["convention"],
        zero_stages=stages,
        allow_offload=not no_offload,
        search_parallelism=search_parallelism,
        max_tp=max_tp,
        margin=margin,
        host_memory_bytes=host,
        gpus_per_node=per_node,
    )
    res = plan(req)
    if as_json:
        click.echo(json.dumps(res.model_dump(mode="json"), separators=(",", ":")))
    else:
        click.echo(render_plan(res, top))
        click.echo(f"host per node: {per_node} GPUs per node ({source})")
    if not res.candidates:
        raise SystemExit(1)


def _elastic(o: dict[str, Any], margin: float, as_json: bool) -> None:
    """``--nnodes MIN:MAX``: the global-batch table of ``dssup plan-elastic``."""
    from dssup.cli.elastic import plan_elastic, render_table

    table = plan_elastic({**o, "margin": margin})
    if as_json:
        click.echo(json.dumps(table.model_dump(mode="json"), separators=(",", ":")))
    else:
        click.echo(render_table(table))
    if not table.compatible_nnodes:
        raise SystemExit(1)
