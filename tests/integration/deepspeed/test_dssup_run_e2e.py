"""Acceptance: ``dssup run`` steers a real DeepSpeed job through its JSON and resumes it.

Real torchrun, two gloo ranks, DeepSpeed 0.19.8 on CPU, ZeRO-1, a 12-block residual MLP of width
256. The example job switches to 16× longer sequences at step 5 (after its step-4 checkpoint),
the usual way a job that started fine runs out of memory later. Each worker caps its address
space at what it holds after start-up plus ``BUDGET_MB`` (the CPU stand-in for a full GPU,
``dssup.runtime.memory_cap``), and glibc maps every block over 128 KiB and keeps one arena
from start-up (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_ARENA_MAX=1``), so the address space tracks
live tensors rather than cached heap or per-thread arenas (64 MiB of address space each, which
made the need vary from run to run). Measured need above the cap's base (VmPeak, MiB, two
runs each, equal within 0.4 MiB): micro-batch 2: 224.8 fresh, 221.1 resumed; micro-batch 1:
117.0; micro-batch 1 with activation checkpointing: 72.8. With a 95 MiB budget micro-batch 2
fails by 126 MiB, micro-batch 1 by 22 MiB (23 %), and checkpointing passes with 22 MiB spare
(23 %). So dssup must halve the micro-batch (accumulation doubled, the global batch exact,
written into the JSON), see that fail too, then turn on activation checkpointing through the
JSON, resume from the step-4 checkpoint each time, and finish. Four steps before the switch give
the loss-continuity trend a noise estimate (with two, 8-sample batches made it judge a correct
resume a jump); lr 1e-5 keeps the 12 blocks from diverging. Training is seeded, so the losses
repeat exactly from run to run: the trend predicts 0.67 ± 1.51 for steps 5-6, seen 1.17. The
engine's own report after each relaunch must show what the JSON asked for, every user key must
survive, the losses must continue (continuity record) and the global samples must advance
without gap or repeat.

``--no-fast-fail``: with fast-fail, dssup SIGKILLs torchrun at the first rank's error file, and
once (1 run in 3) the other rank's already-printed ``engine`` line was missing from both
torchrun.log and its ``stdout.log`` (0 bytes): output in flight is lost with torchrun. Here
torchrun tears the job down itself, so every attempt's output is complete.

An optimizer-step OOM rescued by a higher ZeRO stage is test_dssup_run_zero_step_e2e.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from ds_launch import ds_events, dssup_run_example, journal_of, needs_deepspeed

from dssup.supervisor.deepspeed.assess import assess_attempt
from dssup.supervisor.deepspeed.continuity import parse_loss_lines

pytestmark = [pytest.mark.e2e, pytest.mark.deepspeed, pytest.mark.slow, needs_deepspeed]
BUDGET_MB = 95
STEPS, GB, LONG_FROM = 6, 8, 4
USER_CONFIG = {
    "train_batch_size": GB,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 2_000_000},
    "gradient_clipping": 1.0,
    "steps_per_print": 1000,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    example_args = [
        "--steps", str(STEPS), "--save-every", str(LONG_FROM), "--width", "256",
        "--depth", "12", "--lr", "1e-5", "--tokens", "256", "--long-tokens", "4096",
        "--long-from-step", str(LONG_FROM), "--mem-cap-mb", str(BUDGET_MB),
    ]  # fmt: skip
    return dssup_run_example(
        tmp_path_factory.mktemp("e2e"),
        USER_CONFIG,
        # --no-fast-fail: see the note on fast-fail in the module docstring
        ["--max-attempts", "5", "--no-fast-fail"],
        example_args,
        timeout=900,
        MALLOC_ARENA_MAX="1",
    )


def test_recovers_through_the_json(run: dict[str, Any]) -> None:
    done = run["done"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ends = journal_of(run["journal"], "attempt-ended")
    assert [e["failure"]["kind"] if e["failure"] else None for e in ends] == [
        "host-oom", "host-oom", None]  # fmt: skip
    steps = [d["step"] for d in journal_of(run["journal"], "decision") if d["action"] == "remedy"]
    assert steps == ["halve-micro-batch", "recompute"]
    starts = journal_of(run["journal"], "attempt-started")
    assert {s["plan"]["global_batch"] for s in starts} == {GB}
    for start in starts[1:]:
        assert start["env"]["DSSUP_DS_RESUME_KIND"] == "direct"
        assert start["env"]["DSSUP_RESUME_FROM"].endswith(f"global_step{LONG_FROM}")


def test_engine_reports_what_the_json_asked_for(run: dict[str, Any]) -> None:
    first, second, third = run["attempts"]
    user = json.loads(run["cfg"].read_text())
    triples = []
    for attempt in (first, second, third):
        written = json.loads((attempt / "ds_config.json").read_text())
        assert written["zero_optimization"] == user["zero_optimization"]
        assert (written["gradient_clipping"], written["steps_per_print"]) == (1.0, 1000)
        engine = ds_events(attempt, "engine")[0]
        triples.append((engine["micro_batch"], engine["grad_accum"], engine["train_batch_size"]))
        if attempt is third:
            assert written["activation_checkpointing"] == {"number_checkpoints": 1}
            assert engine["activation_checkpointing"]["number_checkpoints"] == 1
            assert engine["recompute"] is True
        else:
            assert "activation_checkpointing" not in written and engine["recompute"] is False
    assert triples == [(2, 2, GB), (1, 4, GB), (1, 4, GB)]
    changes = json.loads((third / "ds_config.changes.json").read_text())["changes"]
    assert {c["key"] for c in changes} == {
        "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "activation_checkpointing.number_checkpoints"}  # fmt: skip


def test_loss_continues_and_samples_advance_exactly(run: dict[str, Any]) -> None:
    first, _, third = run["attempts"]
    loaded = ds_events(third, "loaded")[0]
    assert (loaded["global_steps"], loaded["global_samples"]) == (LONG_FROM, LONG_FROM * GB)
    before = parse_loss_lines((first / "torchrun.log").read_text())
    after = parse_loss_lines((third / "torchrun.log").read_text())
    assert [p.step for p in before] == [1, 2, 3, 4] and [p.step for p in after] == [5, 6]
    assert [p.global_samples for p in before + after] == [GB * s for s in range(1, STEPS + 1)]
    record = assess_attempt(third)
    assert record is not None and record.ok, record
    assert record.verdict == "continuous" and record.resumed_at_step == LONG_FROM
    (judged,) = journal_of(run["journal"], "continuity")  # journalled when the attempt ended
    assert (judged["attempt"], judged["adapter"]) == (3, "deepspeed")
    assert (judged["verdict"], judged["ok"]) == ("continuous", True)
    assert journal_of(run["journal"], "run-ended")[0]["outcome"] == "succeeded"
