"""``dssup demo``: the README's main job, on built-in defaults, no arguments needed.

Part 1 predicts: DeepSeek-V3's per-GPU memory on a 1,024-GPU layout (TP 2, PP 16, EP 8,
DP 32, H100s) and the configs of that layout that fit with the global batch exact, by running
``dssup estimate`` and ``dssup plan`` and printing each command before its output.

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
from dssup.cli.run import build_supervisor, print_summary
from dssup.cli.values import Place, Whole
from dssup.errors import ConfigError

__all__ = ["demo_cmd"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# Part 1 runs the CLI's own commands, printed as typed: the figures a user sees running them
# are the demo's, to the byte (the README shows the same commands).
ESTIMATE = ["estimate", "--model", "deepseek-v3", "--tp", "2", "--pp", "16", "--ep", "8",
            "--dp", "32", "--zero", "1", "--recompute", "selective", "--global-batch-size",
            "1024", "--gpu-memory", "H100"]  # fmt: skip
PLAN = ["plan", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep",
        "8", "--fixed-layout", "--global-batch-size", "1024", "--gpu-memory", "H100", "--top",
        "3"]  # fmt: skip


def _run_shown(args: list[str], echo: Any) -> int:
    """Print ``$ dssup ARGS``, run it as its own process, print what it printed."""
    echo("$ dssup " + " ".join(args))
    out = subprocess.run([sys.executable, "-m", "dssup", *args], capture_output=True, text=True,
                         check=False)  # fmt: skip
    echo((out.stdout + out.stderr).rstrip())
    return out.returncode


def _part_one(echo: Any) -> None:
    echo("== 1. Predict: DeepSeek-V3 on 1,024 H100s (TP 2, PP 16, EP 8, DP 32)")
    if _run_shown(ESTIMATE, echo) == 1:
        echo("(exit status 1: it does not fit; the plan below finds what does)")
    echo("")
    _run_shown(PLAN, echo)


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
    click.echo(f"== 2. Recover: a real torchrun job (micro-batch 16, global batch 32, {said})")
    click.echo("$ dssup run --device cpu --backoff 0.5 --quiet --global-batch-size 32 "
               "--micro-batch-size 16 --checkpoint-dir "
               f"{work / 'checkpoints'} --run-dir {work / 'run'} -- torchrun --standalone "
               f"--nproc-per-node 2 {script} {' '.join(cap)} --memory-cap-ranks 1 --out "
               f"{work / 'recovered.pt'}")  # fmt: skip
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
