"""``dssup gpus``: the one GPU table, so a user can see which names ``--gpu-memory`` takes and
which figure each stands for (the driver's, as GPU Feature Discovery labels it)."""

from __future__ import annotations

import json

import click

from dssup.cli.app import main
from dssup.errors import ConfigError
from dssup.memory.gpus import GPU_TABLE, GpuSpec, find_gpu

__all__ = ["gpus_cmd"]


def _row(g: GpuSpec) -> tuple[str, ...]:
    return (
        g.name,
        g.vendor,
        str(g.memory_mib),
        f"{g.memory_mib / 1024:.2f}",
        ", ".join(g.aliases),
        ", ".join(g.products),
    )


def _table(specs: tuple[GpuSpec, ...]) -> str:
    header = ("name", "vendor", "MiB", "GiB", "aliases", "node label (product)")
    rows = [header, *(_row(g) for g in specs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows
    ]
    return "\n".join([*lines[:1], "-" * len(lines[0]), *lines[1:]])


def _detail(g: GpuSpec) -> str:
    def flops(v: float | None) -> str:
        return "-" if v is None else f"{v / 1e12:g} TFLOP/s"

    s = g.system
    lines = [
        f"{g.name} ({g.vendor}): {g.memory_mib} MiB = {g.memory_mib / 1024:.2f} GiB "
        "as the driver reports it",
        f"  memory source:   {g.memory_source}",
        f"  node labels:     {', '.join(g.products)}",
        f"  aliases:         {', '.join(g.aliases)}",
        f"  dense BF16/FP8/FP16: {flops(g.bf16_flops)} / {flops(g.fp8_flops)} / "
        f"{flops(g.fp16_flops)}",
        f"  GPU link:        {g.link}"
        + ("" if g.link_bytes_per_s is None else f", {g.link_bytes_per_s / 1e9:g} GB/s"),
        f"  host link:       {g.host_link}, {g.host_bytes_per_s / 1e9:g} GB/s",
        f"  compute source:  {g.compute_source}",
        f"  reference node:  {s.name}: {s.gpus_per_node} GPUs, NIC "
        f"{'-' if s.nic_gbit_per_gpu is None else f'{s.nic_gbit_per_gpu:g} Gb/s'} per GPU, "
        f"host {'-' if s.host_memory_bytes is None else f'{s.host_memory_bytes / 2**30:g} GiB'}"
        f", {'-' if s.host_cpu_cores is None else s.host_cpu_cores} cores",
        f"  system source:   {s.source}",
        f"  unverified:      {', '.join(g.unverified) or 'none'}",
    ]
    if g.notes:
        lines.append(f"  notes:           {g.notes}")
    return "\n".join(lines)


@main.command("gpus")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def gpus_cmd(name: str | None, as_json: bool) -> None:
    """List the GPUs dssup knows, with memory as the driver reports it.

    \b
    The MiB figure is nvidia-smi's total (GPU Feature Discovery's nvidia.com/gpu.memory label),
    i.e. what a pod really gets; every figure names its source. Give NAME (an alias, a node
    label value or an nvidia-smi name) to see one GPU in full.

    \b
    Examples:
      dssup gpus
      dssup gpus h100
      dssup gpus NVIDIA-A100-SXM4-80GB --json
    """
    specs = GPU_TABLE
    if name is not None:
        spec = find_gpu(name, "NAME")
        if spec is None:
            raise ConfigError("NAME", f"unknown GPU {name!r}", "run `dssup gpus` for the names")
        specs = (spec,)
    if as_json:
        out = [{**g.model_dump(mode="json"), "memory_gib": g.memory_mib / 1024} for g in specs]
        click.echo(json.dumps(out if name is None else out[0], separators=(",", ":")))
    elif name is not None:
        click.echo(_detail(specs[0]))
    else:
        click.echo(_table(specs))
