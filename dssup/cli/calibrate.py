"""``dssup calibrate``: trace a model's training step and store the profile the estimator uses.

``--hf CONFIG`` and ``--module pkg.mod:factory`` trace the user's own model code (a
``traced`` profile: every window of the step, fitted over micro-batch and sequence length,
refused when it does not reproduce its own traces); ``--model`` traces dssup's reference blocks
of that size (the older ``eager`` profile). The torch work runs in a child process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.measure import REFERENCE, TRACED, common_options, reference_spec
from dssup.cli.traced import run_child, source_options, traced_knobs, traced_source
from dssup.cli.values import TRACE_SEQ_LEN, Choice, Place
from dssup.errors import ConfigError
from dssup.memory.profile import EagerProfile
from dssup.memory.traced import TracedProfile

__all__ = ["calibrate_cmd", "trace_grid"]


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(flag, f"cannot read {text!r}", "give comma-separated integers") from exc
    if any(v < 1 for v in values):
        raise ConfigError(flag, f"{text!r} has a value below 1", "use positive integers")
    return values


def _round8(x: int) -> int:
    return max(8, -(-x // 8) * 8)


def trace_grid(o: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, int, int], int]:
    """(micro-batches, sequence lengths, check length) of the traces, from the flags."""
    micro = _ints(o["trace_micro_batches"], "--trace-micro-batches")
    if len(micro) < 3 or len(set(micro)) != len(micro):
        raise ConfigError(
            "--trace-micro-batches", "needs three or more different values", "e.g. 2,3,4"
        )
    s = o["seq_len"]
    if o["trace_seq_lens"]:
        seqs = _ints(o["trace_seq_lens"], "--trace-seq-lens")
    else:
        seqs = (_round8(s // 4), _round8(s // 2), _round8(s))
    if len(seqs) != 3 or len(set(seqs)) != 3:
        raise ConfigError(
            "--trace-seq-lens", "needs three different lengths", "e.g. 1024,2048,4096"
        )
    check = o["check_seq_len"] or _round8(3 * s // 4)
    if check in seqs:
        raise ConfigError(
            "--check-seq-len", f"{check} is one of the fitted lengths", "pick a fourth length"
        )
    return micro, (seqs[0], seqs[1], seqs[2]), check


def _write(out: Path, doc: dict[str, Any]) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)  # atomic: a failed run never leaves half a profile


def _report(p: TracedProfile, out: Path) -> str:
    v = p.provenance
    lines = [
        f"traced profile written to {out}",
        f"  model: {p.found}",
        f"  traced: micro-batches {', '.join(map(str, v.micro_batches))} x sequence "
        f"{', '.join(map(str, v.seq_lens))} (check {v.check_seq_len}), recompute "
        f"{', '.join(p.levels)}; {v.traces} FakeTensorMode traces in {v.seconds:.0f} s, peak "
        f"RSS {v.peak_rss_bytes / 2**20:.0f} MiB",
        f"  self-check: the profile replays its traces within {p.worst_check:.3%}",
    ]
    if v.knobs.get("kernels") == "cuda":
        used = v.knobs.get("attention_kernels", "no SDPA call")
        lines.append(f"  attention as CUDA runs it (PyTorch's SDPA dispatch): {used}")
    elif v.knobs.get("kernels") == "cpu":
        lines.append("  attention as this CPU runs it (--kernels cpu): not what a GPU keeps")
    if p.breakdown:
        lines.append("  largest tensors at the forward/backward peak of the largest trace:")
        lines += [f"    {size / 2**20:10.2f} MiB  {n:4d} x {lb}" for lb, n, size in p.breakdown[:6]]
    return "\n".join(lines)


@main.command("calibrate")
@common_options
@source_options
@click.option(
    "--out",
    type=Place("file"),
    required=True,
    help="Where to write the profile JSON.",
)
@click.option(
    "--trace-micro-batches",
    default="2,3,4",
    show_default=True,
    help="--hf/--module: micro-batches of every traced line (three or more).",
)
@click.option(
    "--trace-seq-lens",
    default=None,
    help="--hf/--module: the three fitted lengths (default: seq/4, seq/2, seq).",
)
@click.option(
    "--check-seq-len",
    type=TRACE_SEQ_LEN,
    default=None,
    help="--hf/--module: length of the check trace the fit never sees (default: 3*seq/4).",
)
@click.option(
    "--recompute-levels",
    type=Choice(["none,full", "none", "full"]),
    default="none,full",
    show_default=True,
    help="--hf/--module: levels traced (full: every repeated block checkpointed).",
)
@click.option(
    "--kernels",
    type=Choice(["cuda", "cpu"]),
    default="cuda",
    show_default=True,
    help="--hf/--module: whose attention kernels the trace runs. cuda: the kernel CUDA's SDPA "
    "dispatch picks (flash, memory-efficient or math), so the profile holds what a GPU keeps; "
    "cpu: what this CPU runs (its math path keeps s x s FP32 probabilities for MLA), for a "
    "profile checked against `dssup measure` on this CPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON too.")
def calibrate_cmd(out: Path, as_json: bool, recompute_levels: str, kernels: str, **o: Any) -> None:
    """Trace a model's training step under FakeTensorMode and store its profile (needs torch).

    \b
    Your own model code, at its full size (nothing is allocated):
      dssup calibrate --hf deepseek-ai/DeepSeek-V3 --seq-len 4096 --dtype bf16 --out v3.json
      dssup calibrate --module custom_block.model:factory --module-path examples \\
          --seq-len 512 --out block.json
    then:
      dssup estimate --model deepseek-ai/DeepSeek-V3 --calibration v3.json --pp 16 --ep 64 \\
          --dp 128 --global-batch-size 15360 --recompute full --gpu-memory H800
    and, to check a profile against real CPU steps, trace the CPU's kernels:
      dssup calibrate --hf examples/custom_block/config.json --kernels cpu --out tiny.json
      dssup measure --hf examples/custom_block/config.json -b 4 --calibration tiny.json

    \b
    The step is traced at three or more micro-batches for each of three sequence lengths, for
    each recompute level, plus a check trace at a fourth length; a profile that does not
    reproduce its own traces (0.1 %) is refused with the traces that disagree. --model traces
    dssup's reference blocks instead (the older eager profile):
      dssup calibrate --model deepseek-v2-lite --seq-len 1024 --dtype bf16 --out v2lite.json
    """
    source = traced_source(o)
    if source is None:
        eager = run_child(REFERENCE, "calibrate", reference_spec(o))
        EagerProfile.model_validate(eager)
        _write(out, eager)
        click.echo(f"eager profile written to {out}")
        return
    micro, seqs, check = trace_grid(o)
    knobs = {**traced_knobs({**o, "recompute": "none"}), "kernels": kernels}
    request = {
        "source": source,
        "knobs": knobs,
        "levels": recompute_levels.split(","),
        "micro_batches": micro,
        "seq_lens": seqs,
        "check_seq_len": check,
    }
    doc = run_child(TRACED, "calibrate", request)
    profile = TracedProfile.model_validate(doc)
    _write(out, doc)
    if as_json:
        click.echo(json.dumps(doc, separators=(",", ":")))
        return
    click.echo(_report(profile, out))
