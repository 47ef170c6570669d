"""``dssup estimate``: per-GPU memory of one training config, as a table, JSON or a chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.options import (
    build_inputs,
    host_inputs,
    layout_options,
    model_options,
    overhead_options,
    training_options,
)
from dssup.cli.plot import plot_estimate
from dssup.cli.render import render_estimate
from dssup.errors import ConfigError
from dssup.memory import Estimate, estimate

__all__ = ["estimate_cmd", "run_estimate"]


def _dp_and_accum(o: dict[str, Any]) -> tuple[int, int]:
    dp = o["dp"]
    if o["world_size"]:
        mp = o["tp"] * o["pp"] * o["cp"]
        if o["world_size"] % mp:
            raise ConfigError(
                "--world-size",
                f"{o['world_size']} is not a multiple of tp*pp*cp={mp}",
                "choose a GPU count divisible by the model-parallel size",
            )
        dp = o["world_size"] // mp
    accum = o["grad_accum"]
    gbs = o["global_batch_size"]
    if gbs is not None:
        rows = o["micro_batch"] * dp
        if gbs % rows:
            raise ConfigError(
                "--global-batch-size",
                f"{gbs} is not a multiple of micro-batch x dp = {rows}",
                "pick a micro-batch that divides global batch / dp",
            )
        if accum is not None and accum != gbs // rows:
            raise ConfigError(
                "--grad-accum",
                f"{accum} disagrees with --global-batch-size {gbs}",
                f"drop --grad-accum or set it to {gbs // rows}",
            )
        accum = gbs // rows
    if accum is None and o["pp"] > 1:
        raise ConfigError(
            "--global-batch-size",
            f"with --pp {o['pp']} the micro-batches in flight depend on the accumulation, "
            "which is not given",
            "pass --global-batch-size (or --grad-accum)",
        )
    return dp, accum or 1


def run_estimate(o: dict[str, Any]) -> Estimate:
    """Build inputs from parsed flags and estimate (shared with ``dssup demo``)."""
    dp, accum = _dp_and_accum(o)
    model, layout, training, overheads, gpu = build_inputs(o, dp, accum)
    host, per_node, source = host_inputs(o)
    est = estimate(model, layout, training, overheads, o["convention"], gpu, host, per_node)
    line = f"GPUs per node: {per_node} ({source})"
    return est.model_copy(update={"assumptions": [*est.assumptions, line]})


@main.command("estimate")
@model_options
@layout_options
@click.option("--dp", type=int, default=1, show_default=True, help="Data-parallel size.")
@click.option(
    "--world-size",
    "--gpus",
    "world_size",
    type=int,
    default=None,
    help="Total GPUs; sets --dp to world / (tp*pp*cp).",
)
@click.option(
    "--global-batch-size",
    type=int,
    default=None,
    help="Sequences per step; sets --grad-accum = global / (micro x dp).",
)
@training_options
@overhead_options
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as one JSON object.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG: stacked bar per stage with the GPU capacity line.",
)
@click.option("--verbose", "-v", is_flag=True, help="Also list the peak stage's activation terms.")
def estimate_cmd(as_json: bool, plot: Path | None, verbose: bool, **o: Any) -> None:
    """Predict per-GPU memory of a training config, stage by stage.

    \b
    Every term is reported in bytes (GiB in the table): weights, gradients, optimizer states
    after ZeRO, activations x in-flight micro-batches, ZeRO-3 working set, buffers,
    fragmentation and CUDA context; the peak stage and the phase of the peak (forward-backward
    or optimizer step), plus the assumptions made.

    \b
    Examples:
      dssup estimate --model deepseek-v3 --tp 2 --pp 16 --ep 8 --dp 32 --gpu-memory 80GiB \\
          --global-batch-size 1024
      dssup estimate --model deepseek-v3 --convention paper --tp 2 --pp 16 --ep 8 --dp 32 \\
          --grad-accum 16
      dssup estimate --model deepseek-v3 --tp 1 --pp 16 --ep 64 --gpus 2048 --schedule dualpipe \\
          --layers-per-stage 3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 --global-batch-size 15360 --zero 1 \\
          --precision fp8 --dtypes moments=bf16 --framework deepseek --recompute selective \\
          --gpu-memory H800   # DeepSeek-V3 as trained (docs/memory-model.md)
      dssup estimate --model ./my-model/config.json --gpus 64 --tp 8 --zero 1 \\
          --global-batch-size 512 --recompute selective --json
      dssup estimate --model meta-llama/Meta-Llama-3-70B --gpus 64 --tp 8 --pp 2 \\
          --global-batch-size 512 --zero 1
      dssup estimate --model llama-3-70b --gpus 8 --zero 3 --offload both \\
          --gpu-memory H100 --host-memory 2TiB
    Hub ids, presets and the model types read exactly: dssup models.
    With --host-memory (per node) the host is checked too: offloaded optimizer states and
    parameters as DeepSpeed keeps them, times the GPUs per node (--gpus-per-node, default from
    the GPU table), and the model build on the host when --host-load-dtype says so.
    Exit status: 0 fits (or nothing to check), 1 does not fit the GPU or the host, 2 bad input.
    """
    est = run_estimate(o)
    if plot is not None:
        plot_estimate(est, plot)
    if as_json:
        click.echo(json.dumps(est.model_dump(mode="json"), separators=(",", ":")))
    else:
        click.echo(render_estimate(est, verbose))
        if plot is not None:
            click.echo(f"chart: {plot}")
    if est.fits is False:
        raise SystemExit(1)
