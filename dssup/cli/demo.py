"""``dssup demo``: the README's main job, on built-in defaults, no arguments needed.

Part 1 predicts: DeepSeek-V3's per-GPU memory on a 1,024-GPU layout (TP 2, PP 16, EP 8,
DP 32, 80 GiB GPUs) with ``dssup.memory``, printed with the ``estimate`` command's table, and the
cheapest config that fits with the global batch exact (``dssup.memory.plan``).

Part 2 recovers: the example job (``examples/train_tiny.py``, a tiny transformer, 2 gloo ranks
under real torchrun) runs under ``dssup run`` with rank 1's memory capped at what micro-batch
16 holds when the logits of step 4 (the first long-sequence step) exist, so that step really
fails in torch's CPU allocator, on any machine (``dssup.runtime.standin``; the budget found is
kept for the next attempt, whose micro-batch of 8 needs about half). dssup classifies the failure,
halves the micro-batch, doubles accumulation, resumes from the step-4 DCP checkpoint and
finishes; the summary shows the attempts, what changed and that the global batch did not; the
final weights are compared with a single-process run that never failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.render import render_estimate
from dssup.cli.run import build_supervisor, print_summary
from dssup.cli.values import Place, Whole
from dssup.errors import ConfigError
from dssup.memory import GiB, Layout, PlanRequest, Training, estimate, plan, preset

__all__ = ["demo_cmd"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYOUT = Layout(tp=2, pp=16, ep=8, dp=32)
GLOBAL_BATCH = 1024


def _part_one(echo: Any) -> None:
    model = preset("deepseek-v3")
    training = Training(micro_batch=1, seq_len=4096, grad_accum=32, recompute="selective",
                        zero_stage=1)  # fmt: skip
    echo("== 1. Predict: DeepSeek-V3 on 1,024 GPUs (TP 2, PP 16, EP 8, DP 32), 80 GiB each")
    echo(render_estimate(estimate(model, LAYOUT, training, gpu_memory_bytes=80 * GiB)))
    req = PlanRequest(model=model, gpu_memory_bytes=80 * GiB, global_batch=GLOBAL_BATCH,
                      layout=LAYOUT, training=training, limit=3)  # fmt: skip
    res = plan(req)
    if res.candidates:
        c = res.candidates[0]
        t = c.training
        echo(
            f"cheapest config that fits (global batch {GLOBAL_BATCH} exact): micro-batch "
            f"{t.micro_batch} x accumulation {t.grad_accum} x DP {c.layout.dp}, recompute "
            f"{t.recompute}, ZeRO-{t.zero_stage}: peak {c.peak_bytes / GiB:.1f} GiB "
            f"({res.evaluated} configs evaluated)"
        )


def _filtered(echo: Any) -> Any:
    """Show the job's progress lines, not every rank's traceback (those stay in the run dir)."""

    def sink(line: str) -> None:
        text = line.split("]:", 1)[-1] if line.startswith("[default") else line
        if text.startswith(("step ", "train_tiny ")) and "[rank" not in text:
            echo(f"   | {text}")
        elif "DefaultCPUAllocator" in line and line.startswith("[default1]:[rank1]: RuntimeError"):
            echo(f"   | rank 1: {text.split(': ', 1)[-1][:150]}")

    return sink


def _reference(work: Path, echo: Any) -> None:
    echo("== 3. Verify: the same global batch and data order, one process, never failing")
    ref = work / "reference.pt"
    subprocess.run([sys.executable, str(EXAMPLES / "train_tiny.py"), "--reference", str(ref)],
                   check=True, capture_output=True)  # fmt: skip
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "compare_weights.py"),
            str(work / "recovered.pt"),
            str(ref),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    cmp = json.loads(out.stdout)
    verdict = "MATCH" if cmp["within_rtol"] else "DIFFER"
    echo(f"final weights vs reference: relative L2 difference {cmp['relative_l2']:.2e}, largest "
         f"element difference {cmp['max_abs']:.2e} over {cmp['tensors']} tensors: {verdict} "
         "(tolerance 1e-5)")  # fmt: skip


@main.command("demo")
@click.option("--workdir", type=Place("dir"), default=None,
              help="Where the run directory, checkpoints and weights go (default ./dssup-runs/demo-<time>).")  # fmt: skip
@click.option("--memory-cap-mib", type=Whole(1, 1 << 20), default=None,
              help="A fixed address-space budget for rank 1 instead (default: what micro-batch "
              "16 holds when step 4's logits exist, measured by the job itself).")  # fmt: skip
@click.option("--skip-estimate", is_flag=True, help="Only the recovery part.")
@click.option("--skip-reference", is_flag=True, help="Do not verify the final weights.")
def demo_cmd(workdir: Path | None, memory_cap_mib: int | None, skip_estimate: bool,
             skip_reference: bool) -> None:  # fmt: skip
    """Predict DeepSeek-V3's memory, then watch dssup recover a real job from a real OOM."""
    script = EXAMPLES / "train_tiny.py"
    if not script.is_file():
        raise ConfigError("demo", f"{script} not found", "run from a checkout of the repository")
    started = time.monotonic()
    if not skip_estimate:
        _part_one(click.echo)
        click.echo("")
    work = (workdir or Path("dssup-runs") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if memory_cap_mib is None:
        cap = ["--memory-cap-at", "forward", "--memory-cap-file", str(work / "memory-cap.json")]
        said = "rank 1's memory capped at what micro-batch 16 holds when step 4's logits exist"
    else:
        cap, said = ["--memory-cap-mib", str(memory_cap_mib)], f"{memory_cap_mib} MiB cap on rank 1"
    click.echo("== 2. Recover: dssup run -- torchrun --nproc-per-node 2 examples/train_tiny.py "
               f"(micro-batch 16, global batch 32, {said})")  # fmt: skip
    command = [
        "torchrun", "--standalone", "--nproc-per-node", "2", str(script), *cap,
        "--memory-cap-ranks", "1", "--out", str(work / "recovered.pt"),
    ]  # fmt: skip
    options = {
        "run_dir": work / "run", "global_batch_size": 32, "micro_batch_size": 16,
        "checkpoint_dir": work / "checkpoints", "device": "cpu", "backoff": 0.5, "quiet": True,
    }  # fmt: skip
    sup = build_supervisor(command, options, sink=_filtered(click.echo))
    outcome = sup.run()
    print_summary(outcome.journal)
    click.echo(f"   story: dssup status {work / 'run'}")
    if outcome.exit_code == 0 and not skip_reference:
        click.echo("")
        _reference(work, click.echo)
    click.echo(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    sys.exit(outcome.exit_code)
