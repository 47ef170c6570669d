"""Elastic and multi-node commands: the global-batch table, and ``dssup run`` across nodes.

``dssup plan-elastic`` (also reached as ``dssup plan --nnodes MIN:MAX``) prints, for a fixed
global batch, which node counts keep it exact, with which micro-batch x accumulation pairs, and
which of those fit each GPU type given (``--gpu-memory H100,A100-40GB``).

Multi-node ``dssup run``: this module adds ``--shared-dir`` and ``--node-rank`` to the ``run``
command (``dssup.cli.run``) and, when ``--shared-dir`` is given, wraps the supervisor it builds
in ``MultiNodeSupervisor``. Without ``--shared-dir`` ``dssup run`` behaves exactly as before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.options import (
    build_layout,
    build_overheads,
    build_training,
    layout_options,
    margin_option,
    model_options,
    overhead_options,
    training_options,
)
from dssup.cli.render_plan import capacity_note
from dssup.cli.run import build_supervisor, print_summary, run_cmd
from dssup.cli.values import BATCH, DEGREE, NODE_RANK, SECONDS, Place, Real
from dssup.elastic import ElasticRequest, ElasticTable, MemoryContext, NodeRange, solve
from dssup.errors import ConfigError
from dssup.memory.capacity import DEFAULT_MARGIN, Band, near_words
from dssup.memory.gpus import parse_size
from dssup.memory.topology import topology_of
from dssup.modelio import load_model
from dssup.supervisor import parse_command
from dssup.supervisor.multinode import MultiNodeConfig, MultiNodeSupervisor
from dssup.supervisor.multinode.launch import check_elastic_command

__all__ = ["capacity_notes", "plan_elastic", "plan_elastic_cmd", "render_table"]

_GIB = 1 << 30


def _gpus(text: str | None) -> dict[str, int]:
    if not text:
        return {}
    return {name.strip(): parse_size(name, "--gpu-memory") for name in text.split(",") if name}


def plan_elastic(o: dict[str, Any]) -> ElasticTable:
    """The table from CLI options (shared by ``plan-elastic`` and ``plan --nnodes``)."""
    if not o.get("global_batch_size"):
        raise ConfigError("--global-batch-size", "required with --nnodes", "e.g. 1024")
    gpus = _gpus(o.get("gpu_memory"))
    memory = None
    if gpus and not o.get("no_memory"):
        memory = MemoryContext(
            model=load_model(o["model"], o.get("approximate_as")),
            layout=build_layout(o, 1),
            base=build_training({**o, "zero": 0, "offload": "none"}, 1),
            gpu_memory_bytes=next(iter(gpus.values())),
            overheads=build_overheads(o),
            convention=o["convention"],
            margin=o.get("margin", DEFAULT_MARGIN),
            topology=topology_of(next(iter(gpus))),  # step times for that GPU's node
        )
    req = ElasticRequest(
        global_batch=o["global_batch_size"],
        nodes=NodeRange.parse(str(o["nnodes"])),
        nproc_per_node=o.get("nproc_per_node") or 1,
        model_parallel=o["tp"] * o["pp"] * o["cp"],
        max_micro_batch=o.get("max_micro_batch"),
    )
    return solve(req, memory, gpus)


def _pairs(row: Any) -> str:
    text = " ".join(f"{s.micro_batch}x{s.grad_accum}" for s in row.splits)
    return text if len(text) <= 48 else text[:45] + "..."


def capacity_notes(o: dict[str, Any]) -> list[str]:
    """What each GPU of ``--gpu-memory`` is judged against, and the margin: the defaults the
    table assumes (``render_plan.capacity_note``)."""
    if o.get("no_memory"):
        return []
    margin = o.get("margin", DEFAULT_MARGIN)
    names = [n.strip() for n in (o.get("gpu_memory") or "").split(",") if n.strip()]
    return [f"assumption: {capacity_note(name, margin)}" for name in names]


def render_table(table: ElasticTable, notes: Sequence[str] = ()) -> str:
    req = table.request
    lines = [
        f"global batch {req.global_batch}, --nnodes {req.nodes} x {req.nproc_per_node} ranks, "
        f"model parallel {req.model_parallel}: {len(table.compatible_nnodes)} of "
        f"{len(table.rows)} node counts keep the batch exact",
        f"{'nodes':>5} {'world':>6} {'dp':>5}  micro x accum",
    ]
    bands: dict[str, Band] = {}  # the uncertainty of the rows near the limit, once each
    for row in table.rows:
        dp = str(row.dp) if row.dp is not None else "-"
        body = _pairs(row) if row.compatible else f"incompatible: {row.reason}"
        lines.append(f"{row.nnodes:>5} {row.world_size:>6} {dp:>5}  {body}")
        for fit in row.memory:
            if fit.best is None:
                why = fit.problem or "nothing fits at any ZeRO stage / recompute / offload"
                lines.append(f"{'':>19}{fit.gpu}: {why}")
                continue
            mbs = ",".join(str(m) for m in fit.fitting_micro_batches)
            best = fit.best.plan.describe().split(": ", 1)[-1]
            peak = fit.best.peak_bytes / _GIB
            near = fit.best.near
            if near is not None:
                bands[near.source] = Band(near.fraction, near.source)
            mark = ", near the limit" if near is not None else ""
            lines.append(
                f"{'':>19}{fit.gpu}: micro {mbs} fit; cheapest {best} ({peak:.1f} GiB{mark})"
            )
    lines += [near_words(b) for b in bands.values()]
    return "\n".join([*lines, *notes])


@main.command("plan-elastic")
@model_options
@click.option("--nnodes", required=True, help="Node range MIN:MAX (or N), as torchrun takes it.")
@click.option("--nproc-per-node", type=DEGREE, default=1, show_default=True, help="Ranks per node.")
@click.option("--global-batch-size", type=BATCH, required=True, help="Kept exact at every size.")
@click.option("--max-micro-batch", type=BATCH, default=None, help="Largest micro-batch listed.")
@click.option("--no-memory", is_flag=True, help="Batch arithmetic only, no memory model.")
@margin_option
@layout_options
@training_options
@overhead_options
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def plan_elastic_cmd(as_json: bool, **o: Any) -> None:
    """Which node counts keep the global batch exact, and what fits each GPU type.

    \b
    The inverse of DeepSpeed's elasticity: the global batch is yours and stays fixed.
    --gpu-memory takes a comma-separated list of GPU types or sizes (H100,A100-40GB,48GiB).
    Example:
      dssup plan-elastic --model llama-3-8b --global-batch-size 1024 --nnodes 4:16 \\
          --nproc-per-node 8 --gpu-memory H100,A100-40GB --seq-len 4096
    Exit status: 0 some node count keeps the batch exact, 1 none does, 2 bad input.
    """
    table = plan_elastic(o)
    if as_json:
        click.echo(json.dumps(table.model_dump(mode="json"), separators=(",", ":")))
    else:
        click.echo(render_table(table, capacity_notes(o)))
    if not table.compatible_nnodes:
        raise SystemExit(1)


# --- multi-node ``dssup run`` ---------------------------------------------------------------
_MN_KEYS = ("shared_dir", "node_rank", "heartbeat", "member_timeout", "settle")
run_cmd.params[-1:-1] = [
    click.Option(
        ["--shared-dir"],
        type=Place("dir"),
        help="Multi-node: a directory every node sees (e.g. next to the checkpoints). "
        "Turns on agreement: one decision per generation, the same plan on every node.",
    ),
    click.Option(
        ["--node-rank"],
        type=NODE_RANK,
        default=None,
        help="Multi-node: this node's rank (default: PET_NODE_RANK, or torchrun --node-rank).",
    ),
    click.Option(
        ["--heartbeat"],
        type=Real(0.0, 3600.0, lo_open=True),
        default=2.0,
        help="Multi-node heartbeat period, s.",
    ),
    click.Option(
        ["--member-timeout"],
        type=Real(0.0, 86400.0, lo_open=True),
        default=20.0,
        help="A node silent this long is gone, s.",
    ),
    click.Option(["--settle"], type=SECONDS, default=5.0, help="Wait for late nodes up to MAX, s."),
]
_single_node = run_cmd.callback


def _node_rank(o: dict[str, Any], cmd: Any) -> int:
    raw = o.get("node_rank")
    if raw is None:
        raw = os.environ.get("PET_NODE_RANK") or cmd.options.get("node-rank")
    if raw is None or not str(raw).isdigit():
        raise ConfigError("--node-rank", "unknown for a multi-node run", "pass --node-rank N")
    return int(raw)


def _multi_node(command: tuple[str, ...], o: dict[str, Any], mn: dict[str, Any]) -> None:
    shared = Path(mn["shared_dir"]).resolve()
    cmd = parse_command(list(command))
    check_elastic_command(cmd)
    rank = _node_rank(mn, cmd)
    if not o.get("run_dir") and not o.get("resume"):
        o["run_dir"] = shared / f"node-{rank}"
    sup = build_supervisor(list(command), o)
    nodes = NodeRange.parse(sup.command.option("nnodes") or "1")
    if nodes.elastic and sup.config.initial_plan.global_batch is None:
        raise ConfigError(
            "--global-batch-size", "needed with --nnodes MIN:MAX", "the batch is kept exact"
        )
    config = MultiNodeConfig(
        shared_dir=shared, node_rank=rank, nodes=nodes,
        nproc_per_node=sup.command.nproc_per_node(),
        run_name=sup.command.option("rdzv-id") or shared.name,
        heartbeat_s=mn["heartbeat"], member_timeout_s=mn["member_timeout"], settle_s=mn["settle"],
    )  # fmt: skip
    outcome = MultiNodeSupervisor.wrap(sup, config).run()
    print_summary(outcome.journal)
    sys.exit(outcome.exit_code)


def _run(command: tuple[str, ...], **o: Any) -> None:
    mn = {k: o.pop(k, None) for k in _MN_KEYS}
    if mn["shared_dir"] is None:
        if _single_node is not None:  # always: click commands have a callback
            _single_node(command=command, **o)
        return
    _multi_node(command, o, mn)


run_cmd.callback = _run
