"""``dssup estimate``: per-GPU memory of one training config, as a table, JSON or a chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.implied import imply
from dssup.cli.options import (
    build_inputs,
    given_params,
    host_inputs,
    layout_options,
    model_options,
    overhead_options,
    training_options,
)
from dssup.cli.plot import plot_estimate
from dssup.cli.render import render_estimate
from dssup.cli.render_plan import capacity_note
from dssup.cli.values import BATCH, DEGREE, GPUS, Place
from dssup.errors import ConfigError
from dssup.memory import Estimate, estimate
from dssup.memory.best_split import choose_split
from dssup.memory.frameworks import implied_framework
from dssup.memory.gpus import find_gpu

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


def run_estimate(o: dict[str, Any], given: set[str] | None = None) -> Estimate:
    """Build inputs from parsed flags and estimate (shared with ``dssup demo``). ``given``: the
    flags typed (the others are defaults): what they imply is filled in and stated, and with
    no --layers-per-stage a pipeline gets the split of least peak (``best_split.py``)."""
    notes = [] if given is None else imply(o, given, "estimate")
    dp, accum = _dp_and_accum(o)
    model, layout, training, overheads, gpu = build_inputs(o, dp, accum)
    if given is not None and "framework" not in given and o["convention"] != "paper":
        fw = implied_framework(model, layout)
        if fw is not None:
            training = training.model_copy(update={"framework": fw})
            notes.append(
                f"--framework {fw}, implied by --schedule dualpipe on {model.name}: DualPipe is "
                "DeepSeek's schedule (Megatron-Core has none); --framework pins another"
            )
    layout, split = choose_split(model, layout, training, overheads, o["convention"])
    notes += [split] if split else []
    host = host_inputs(o)
    est = estimate(
        model, layout, training, overheads, o["convention"], gpu, host.memory, host.per_node
    )
    if o.get("gpu_memory") and find_gpu(o["gpu_memory"], "--gpu-memory") is not None:
        notes.insert(0, capacity_note(o["gpu_memory"], 0.0).removesuffix("; no margin"))
    notes += host.notes(bool(est.host_bytes_per_node))
    return est.model_copy(
        update={
            "assumptions": [*est.assumptions, *notes],
            "host_memory_source": host.memory_source if host.memory is not None else "",
        }
    )


@main.command("estimate")
@model_options
@layout_options
@click.option("--dp", type=DEGREE, default=1, show_default=True, help="Data-parallel size.")
@click.option(
    "--world-size",
    "--gpus",
    "world_size",
    type=GPUS,
    default=None,
    help="Total GPUs; sets --dp to world / (tp*pp*cp).",
)
@click.option(
    "--global-batch-size",
    type=BATCH,
    default=None,
    help="Sequences per step; sets --grad-accum = global / (micro x dp).",
)
@training_options
@overhead_options
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as one JSON object.")
@click.option(
    "--plot",
    type=Place("file"),
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
    or optimizer step), plus the assumptions made. A GPU name is read as the memory CUDA can
    allocate on it; a fit within the memory model's uncertainty is marked "near the limit".
    Without --layers-per-stage a pipeline takes the layer split of least peak among Megatron's
    (even, account-for-embedding/loss, first/last-stage counts); a flag that needs another
    implies it (--recompute-modules: --recompute selective; --offload params: --zero 3;
    --layers-per-stage: --pp) and says so.

    \b
    Examples:
      dssup estimate --model deepseek-v3 --tp 2 --pp 16 --ep 8 --dp 32 --gpu-memory 80GiB \\
          --global-batch-size 1024        # exit 1: does not fit (no recompute, no ZeRO)
      dssup estimate --model deepseek-v3 --convention paper --tp 2 --pp 16 --ep 8 --dp 32 \\
          --grad-accum 16
      dssup estimate --model deepseek-v3 --gpus 2048 --gpu-memory H800 \\
          --global-batch-size 15360 --tp 1 --pp 16 --ep 64 --schedule dualpipe --zero 1 \\
          --precision fp8 --dtypes moments=bf16 --recompute selective
          # DeepSeek-V3 as trained (docs/memory-model.md): DualPipe implies DeepSeek's
          # framework, the layer split of least peak is found (3,4x14,2) and printed
      dssup estimate --model examples/custom_block/config.json --gpus 64 --tp 2 --zero 1 \\
          --global-batch-size 512 --recompute selective --json
      dssup estimate --model meta-llama/Meta-Llama-3-70B --gpus 64 --tp 8 --pp 2 \\
          --global-batch-size 512 --zero 1
      dssup estimate --model llama-3-70b --gpus 8 --zero 3 --offload both --recompute full \\
          --global-batch-size 64 --gpu-memory H100 --host-memory 4TiB
    Hub ids, presets and the model types read exactly: dssup models.
    With --host-memory (per node) the host is checked too: offloaded optimizer states and
    parameters as DeepSpeed keeps them, times the GPUs per node (--gpus-per-node, default from
    the GPU table), and the model build on the host when --host-load-dtype says so.
    Exit status: 0 fits (or nothing to check), 1 does not fit the GPU or the host, 2 bad input.
    """
    est = run_estimate(o, given_params())
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
