"""``dssup run [OPTIONS] -- torchrun ... train.py ...``: run a torchrun job that recovers from OOM.

This module turns flags into a ``SupervisorConfig`` and an initial ``TrainingPlan``, builds the
remedy ladder (with the memory model when ``--model`` is given), runs the supervisor, prints the
summary and exits with the documented status.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.values import (
    BATCH,
    COUNT,
    DEGREE,
    SECONDS,
    SEQ_LEN,
    Choice,
    Existing,
    Place,
    Real,
    Size,
    Whole,
    force_gpu_memory_option,
)
from dssup.errors import ConfigError
from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.obs.metrics import Metrics, NullMetrics, PrometheusMetrics
from dssup.supervisor import (
    Journal,
    LaunchCommand,
    RemedyPlanner,
    Supervisor,
    SupervisorConfig,
    TrainingPlan,
    parse_command,
)
from dssup.supervisor.adapters import PlanAdapter, adapter_applies, load_adapters
from dssup.supervisor.contract import read_plan_flags
from dssup.supervisor.handoff import build_handoff
from dssup.supervisor.jobview import JobView
from dssup.supervisor.story import global_batch_text, story, summarize

__all__ = ["build_supervisor", "initial_plan", "print_summary", "run_cmd"]

EXIT_HELP = """\b
Exit status: 0 the job finished (after any number of recoveries); 3 it finished, but a
recovery was judged broken (the loss jumped or samples were skipped after a resume: see the
journal's continuity record), or the job reported a global batch other than the one dssup
keeps (outcome batch-mismatch: see the journal's job-report record); after giving up, the
last launcher status (128+N when it died of signal N); 125 dssup's own failure; 126 the
command is not runnable; 127 it was not found; 2 bad usage.
"""


def _solve(gb: int | None, mb: int | None, gas: int | None, dp: int) -> tuple[Any, Any, Any]:
    if gb is not None and mb is not None:
        if gb % (mb * dp):
            raise ConfigError(
                "--global-batch-size",
                f"{gb} is not a multiple of micro-batch {mb} x data-parallel {dp}",
                "choose a global batch divisible by micro-batch x ranks",
            )
        want = gb // (mb * dp)
        if gas is not None and gas != want:
            raise ConfigError(
                "--grad-accum",
                f"accumulation {gas} (from --grad-accum or the script's flag) != global batch "
                f"{gb} / (micro-batch {mb} x {dp} data-parallel) = {want}",
                "drop one of them; dssup sets the accumulation that keeps the global batch",
            )
        return gb, mb, want
    if gb is not None:
        if gb % dp:
            raise ConfigError("--global-batch-size", f"{gb} not divisible by dp={dp}", "")
        return gb, gb // (dp * (gas or 1)) or 1, gas or 1
    if mb is not None:
        return mb * (gas or 1) * dp, mb, gas or 1
    return None, None, gas


def initial_plan(
    cmd: LaunchCommand,
    o: dict[str, Any],
    adapters: list[PlanAdapter],
    found: dict[str, Any] | None = None,
    defaults: Mapping[str, int] | None = None,
) -> TrainingPlan:
    """Attempt 1's plan: dssup flags first, then what the script's framework takes from the
    command (``found``; by default the batch flags on it), then the framework's own defaults
    where they agree with the rest (HF: per-device batch 8, accumulation 1), then adapters."""
    world = cmd.world_size()
    mp = o.get("tp", 1) * o.get("pp", 1) * o.get("cp", 1)
    if world % mp:
        raise ConfigError("--tp/--pp/--cp", f"tp*pp*cp={mp} does not divide {world} ranks", "")
    found = dict(read_plan_flags(cmd.script_args)) if found is None else found
    gb = o.get("global_batch_size") or found.get("global_batch")
    mb = o.get("micro_batch_size") or found.get("micro_batch")
    gas = o.get("grad_accum") or found.get("grad_accum")
    dp, d = world // mp, defaults or {}
    if mb is None and "micro_batch" in d and (gb is None or gb % (d["micro_batch"] * dp) == 0):
        mb = d["micro_batch"]
    if gb is None and gas is None and "grad_accum" in d:
        gas = d["grad_accum"]
    gb, mb, gas = _solve(gb, mb, gas, dp)
    plan = TrainingPlan(
        micro_batch=mb, grad_accum=gas, global_batch=gb, dp=world // mp, world_size=world,
        recompute=o.get("recompute") or found.get("recompute") or "none",
        zero_stage=o.get("zero_stage") or 0,
    )  # fmt: skip
    for adapter in adapters:
        plan = adapter.initial_plan(cmd, plan)
    return plan


def _run_id(command: list[str], o: dict[str, Any]) -> str:
    key = repr((os.getcwd(), command, sorted((k, str(v)) for k, v in o.items())))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _unique_id(run_dir: Path) -> str:
    """The directory's name plus a hash of its absolute path: tokens of two runs never meet."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return f"{run_dir.name}-{digest}"


def _run_dir(command: list[str], o: dict[str, Any]) -> tuple[str, Path]:
    explicit = o.get("resume") or o.get("run_dir")
    if explicit:
        journal = Journal(Path(explicit))
        started = journal.first("run-started")
        run_id = started["run_id"] if started else _unique_id(Path(explicit))
        return run_id, Path(explicit)
    base = _run_id(command, o)
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        run_dir = Path("dssup-runs") / run_id
        if not Journal(run_dir).ended:
            return run_id, run_dir
    raise ConfigError("--run-dir", "too many finished runs for this command", "pass --run-dir")


def _model_step(o: dict[str, Any], plan: TrainingPlan, say: Any) -> Any:
    """The memory-model rung for ``--model``, saying what its fits are judged against."""
    if not o.get("model"):
        if o.get("calibration"):
            raise ConfigError("--calibration", "applies to --model", "add --model CONFIG")
        return None
    from dssup.cli.options import load_profile
    from dssup.cli.render_plan import capacity_note
    from dssup.memory import Layout, Training
    from dssup.memory.gpus import parse_size
    from dssup.memory.topology import topology_of
    from dssup.modelio import load_model
    from dssup.supervisor.modelplan import ModelStep

    if not o.get("gpu_memory"):
        raise ConfigError("--gpu-memory", "needed with --model", "e.g. --gpu-memory 80GiB or H100")
    layout = Layout(tp=o["tp"], pp=o["pp"], cp=o["cp"], ep=o["ep"], dp=plan.dp)
    base = Training(seq_len=o["seq_len"], implementation=load_profile(o.get("calibration")))
    say(f"dssup: --model remedies: {capacity_note(o['gpu_memory'], o['margin'])}")
    return ModelStep(
        model=load_model(o["model"]), layout=layout, base=base,
        gpu_memory_bytes=parse_size(o["gpu_memory"], "--gpu-memory"), margin=o["margin"],
        topology=topology_of(o["gpu_memory"]),
    )  # fmt: skip


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    has_gpu = any(d.startswith("nvidia") and d[6:].isdigit() for d in os.listdir("/dev"))
    return "cuda" if has_gpu else "cpu"


def build_supervisor(command: list[str], o: dict[str, Any], sink: Any = None) -> Supervisor:
    """Everything ``dssup run`` does before launching; ``dssup demo`` reuses it."""
    run_id, run_dir = _run_dir(command, o)
    journal = Journal(run_dir)
    if journal.started and not command:
        command = list(journal.records[0]["command"])
    if not command:
        raise ConfigError("command", "no command given", "add: -- torchrun ... train.py")
    if journal.started and list(journal.records[0]["command"]) != list(command):
        raise ConfigError("--resume", f"{run_dir} belongs to another command", "use --run-dir")
    cmd = parse_command(command)
    adapters = load_adapters() if o.get("adapters", True) else []
    base = initial_plan(cmd, o, [])
    blank = TrainingPlan(dp=base.dp, world_size=base.world_size)
    adapters = [a for a in adapters if adapter_applies(a, cmd, blank)]
    handoff, job, framework = build_handoff(cmd, adapters, o.get("checkpoint_dir"))
    plan = initial_plan(cmd, o, adapters, framework.initial(job), framework.defaults)
    ckpt = handoff.checkpoint_dir
    config = SupervisorConfig(
        run_id=run_id, run_dir=run_dir.resolve(), command=list(command), initial_plan=plan,
        checkpoint_dir=Path(ckpt).resolve() if ckpt else None,
        checkpoint_pattern=o.get("checkpoint_pattern"), device=_device(o.get("device", "auto")),
        max_attempts=o.get("max_attempts", 8), max_no_progress=o.get("max_no_progress", 5),
        transient_retries=o.get("transient_retries", 3),
        backoff_initial_s=o.get("backoff", 1.0), grace_s=o.get("grace", 10.0),
        metrics_textfile=Path(o["metrics_textfile"]) if o.get("metrics_textfile") else None,
        stream_output=not o.get("quiet", False),
        fast_fail=o.get("fast_fail", True),
    )  # fmt: skip
    metrics: Metrics = PrometheusMetrics() if config.metrics_textfile else NullMetrics()
    steps = [s for a in adapters for s in a.remedy_steps()]
    say = sink if sink is not None else click.echo
    planner = RemedyPlanner.default(_model_step(o, plan, say), steps)
    out = sink if sink is not None else (click.echo if config.stream_output else None)
    view = JobView(handoff, job, framework, adapters)
    return Supervisor(config, cmd, planner, adapters, metrics, sink=out, view=view, say=say)


def print_summary(journal: Journal, echo: Any = click.echo) -> None:
    s = summarize(journal)
    echo("")
    echo(f"dssup: {s.outcome} after {s.attempts} attempt(s); run directory {journal.path.parent}")
    for failure in s.failures:
        echo(f"  failed   {failure}")
    for change in s.changes:
        echo(f"  changed  {change}")
    echo(f"  {global_batch_text(s)}")
    echo(
        f"  time lost (failed attempts + relaunches, an upper bound) {s.time_lost_s:.1f} s "
        f"of {s.wall_s:.1f} s"
    )
    if s.relaunch_overheads_s:
        worst = max(s.relaunch_overheads_s)
        echo(f"  relaunch overhead (torchrun exit -> next launch): max {worst * 1000:.0f} ms")


@main.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog=EXIT_HELP,
)
@click.option("--run-dir", type=Place("dir"), help="Default ./dssup-runs/<run-id>.")
@click.option("--resume", type=Existing("dir"), help="Continue this run.")
@click.option("--global-batch-size", type=BATCH, help="Sequences per optimizer step (kept exact).")
@click.option("--micro-batch-size", type=BATCH, help="Sequences per micro-batch per rank.")
@click.option("--grad-accum", type=BATCH, help="Micro-batches per optimizer step.")
@click.option("--recompute", type=Choice(["none", "selective", "full"]), default=None)
@click.option(
    "--zero-stage", type=Whole(0, 3), default=None, help="DeepSpeed ZeRO stage of attempt 1."
)
@click.option("--checkpoint-dir", type=Place("dir"), help="Where the job saves.")
@click.option("--checkpoint-pattern", help="Glob under --checkpoint-dir (default: auto-detect).")
@click.option("--model", help="Preset or config.json: plan remedies with the memory model.")
@click.option("--gpu-memory", type=Size("gpu"), help="GPU capacity for --model: 80GiB, H100, ...")
@force_gpu_memory_option
@click.option(
    "--calibration",
    type=Existing("file"),
    help="Profile from `dssup calibrate` for --model (your own model code's bytes).",
)
@click.option("--seq-len", type=SEQ_LEN, default=4096, show_default=True)
@click.option("--tp", type=DEGREE, default=1, show_default=True)
@click.option("--pp", type=DEGREE, default=1, show_default=True)
@click.option("--cp", type=DEGREE, default=1, show_default=True)
@click.option("--ep", type=DEGREE, default=1, show_default=True)
@click.option(
    "--margin",
    type=Real(0.0, 1.0, hi_open=True),
    default=DEFAULT_MARGIN,
    show_default=True,
    help="Extra fraction of the GPU memory a --model remedy keeps free. Default none: a fit is "
    "judged against what CUDA can allocate; a remedy within the memory model's uncertainty "
    "says so.",
)
@click.option("--device", type=Choice(["auto", "cpu", "cuda"]), default="auto")
@click.option("--max-attempts", type=COUNT, default=8, show_default=True)
@click.option("--max-no-progress", type=COUNT, default=5, show_default=True)
@click.option("--transient-retries", type=Whole(0, 100_000), default=3, show_default=True)
@click.option("--backoff", type=SECONDS, default=1.0, show_default=True, help="First backoff, s.")
@click.option("--grace", type=SECONDS, default=10.0, show_default=True, help="SIGTERM->SIGKILL, s.")
@click.option("--metrics-textfile", type=Place("file"), help="Prometheus textfile.")
@click.option("--quiet", is_flag=True, help="Do not copy torchrun's output to stdout.")
@click.option(
    "--fast-fail/--no-fast-fail", default=True, show_default=True,
    help="Stop an attempt at the first rank error file naming an OOM or a user error.",
)  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_cmd(command: tuple[str, ...], **o: Any) -> None:
    """Run a torchrun command; on OOM, relaunch it with a plan that fits (global batch exact).

    \b
      dssup run --global-batch-size 32 --checkpoint-dir ckpt -- \\
          torchrun --standalone --nproc-per-node 2 examples/train_tiny.py --micro-batch-size 16
    """
    sup = build_supervisor(list(command), o)
    outcome = sup.run()
    print_summary(outcome.journal)
    if o.get("verbose_story"):
        for line in story(outcome.journal):
            click.echo(line)
    sys.exit(outcome.exit_code)
