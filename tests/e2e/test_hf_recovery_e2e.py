"""Acceptance: a stock run_clm-style Hugging Face Trainer script recovers from a real OOM.

``examples/hf/run_clm.py`` (``HfArgumentParser``, ``TrainingArguments``,
``trainer.train(resume_from_checkpoint=...)``, a 2-layer GPT-2 with hidden size 32, random
init, local synthetic data) knows nothing about dssup. Its only addition is the CPU notes'
memory cap: from optimizer step 6 on, every rank's address space is capped at what its first
micro-batch of that step holds when its logits exist, plus 1 MiB (``RUN_CLM_MEMORY_CAP_AT``,
the same on any machine; the next attempt caps at the budget found), which the loss of a
per-device batch of 16 exceeds in torch's own allocator (real ``DefaultCPUAllocator``
failures) and a batch of 8, holding about half, does not. Under ``dssup run --global-batch-size 32`` with torchrun, and again
with ``accelerate launch``, dssup must halve the per-device batch with HF's own flags, resume
from ``checkpoint-4`` through ``--resume_from_checkpoint``, have the Trainer itself confirm
global batch 32, and end with the weights of a run that never failed (the same job with no cap,
under ``dssup run`` too: see ``never_failed``; 1e-5 relative; the data is dropped to whole
batches so every step sees the same 32 samples).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.memprobe import HEAP  # glibc's heap pinned, whatever the caller sets
from tests.procs import run_reaped

# the runs below stop everything they started on a timeout (tests/procs.py), also when
# pytest-timeout cuts in first
pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(1500)]
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "hf" / "run_clm.py")
BIN = Path(sys.executable).parent
MODEL = ("n_layer=2,n_embd=32,n_head=2,vocab_size=256,n_positions=256,resid_pdrop=0,"
         "embd_pdrop=0,attn_pdrop=0,bos_token_id=0,eos_token_id=0")  # fmt: skip
CAP = {"RUN_CLM_MEMORY_CAP_AT": "forward", "RUN_CLM_MEMORY_CAP_FROM_STEP": "5"}
# glibc maps and unmaps large blocks from the start, so the address space tracks live tensors
MALLOC = HEAP
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
ACCELERATE = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", "0"]  # fmt: skip


def _args(out: Path) -> list[str]:
    return [
        SCRIPT, "--model_type", "gpt2", "--config_overrides", MODEL, "--block_size", "256",
        "--synthetic_samples", "256", "--do_train", "--output_dir", str(out),
        "--per_device_train_batch_size", "16", "--max_steps", "8", "--save_steps", "2",
        "--use_cpu", "--ddp_backend", "gloo", "--report_to", "none", "--dataloader_drop_last",
        "--logging_steps", "1", "--disable_tqdm", "true",
    ]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **MALLOC, **extra}


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _relative(a: dict, b: dict) -> float:
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in b)
    den = sum(float((b[k].double() ** 2).sum()) for k in b)
    return (num / den) ** 0.5


@pytest.fixture(scope="module")
def never_failed(tmp_path_factory) -> dict:
    """The weights of the same job with no cap, launched the same way (``dssup run``, torchrun).

    Like the stock run_clm, the script never destroys its process group, and torch 2.13's gloo
    then sometimes aborts a rank at interpreter exit ("terminate called without an active
    exception", SIGABRT; 1 run in 15 here), after the final weights are written. A bare torchrun
    fails on that; dssup reads it as a teardown once it sees the final save whole (the
    ``trainer_state.json`` and ``model.safetensors`` this attempt wrote), which is all it may be
    here: one attempt, no failure but that one (30 runs here: 28 clean, 2 such teardowns).
    """
    out, records, _ = _dssup(tmp_path_factory.mktemp("reference"), TORCHRUN)
    ends = _of(records, "attempt-ended")
    assert [(e["failure"] or {"kind": "teardown"})["kind"] for e in ends] == ["teardown"], ends
    return _weights(out)


def _dssup(base: Path, launcher: list[str], **extra: str) -> tuple[Path, list[dict], str]:
    out, run = base / "out", base / "run"
    res = run_reaped(
        [str(BIN / "dssup"), "run", "--run-dir", str(run), "--global-batch-size", "32", "--",
         *launcher, *_args(out)],
        600, run, env=_env(**extra), cwd=base,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    records = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    return out, records, res.stdout


def _recover(tmp_path: Path, launcher: list[str]) -> tuple[Path, list[dict], str]:
    return _dssup(tmp_path, launcher, **CAP,
                  RUN_CLM_MEMORY_CAP_FILE=str(tmp_path / "cap-{rank}.json"))  # fmt: skip


def _of(records: list[dict], type_: str) -> list[dict]:
    return [r for r in records if r["type"] == type_]


def _check(out: Path, records: list[dict], stdout: str, never_failed: dict) -> None:
    starts, ends = _of(records, "attempt-started"), _of(records, "attempt-ended")
    reports = _of(records, "job-report")
    assert len(starts) == 2
    oom = ends[0]["failure"]
    assert oom["kind"] == "host-oom" and oom["signature"] == "cpu-allocator"
    assert ends[0]["checkpoint_step"] == 4  # died in step 6: checkpoint-6 was never written
    argv = starts[1]["argv"]
    assert argv[argv.index("--per_device_train_batch_size") + 1] == "8"
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "2"
    resume = argv[argv.index("--resume_from_checkpoint") + 1]
    assert resume == str(out.resolve() / "checkpoint-4") and starts[1]["resume_step"] == 4
    assert [r["batch"]["status"] for r in reports] == ["verified", "verified"]
    assert [r["batch"]["reported"] for r in reports] == [[32], [32]]
    assert [r["first_step"] for r in reports] == [0, 4]  # the Trainer itself resumed at 4
    assert "global batch 32 (verified by the job in every attempt)" in stdout
    assert "via --resume_from_checkpoint" in stdout and "unchanged" not in stdout
    handoff = _of(records, "handoff")[0]
    assert handoff["framework"] == "hf-trainer"
    assert _relative(_weights(out), never_failed) < 1e-5


def test_torchrun_hf_trainer_recovers_with_its_own_flags(tmp_path, never_failed):
    _check(*_recover(tmp_path, TORCHRUN), never_failed)


def test_accelerate_launch_hf_trainer_recovers_with_its_own_flags(tmp_path, never_failed):
    out, records, stdout = _recover(tmp_path, ACCELERATE)
    assert next(r for r in records if r["type"] == "handoff")["launcher"] == "accelerate"
    _check(out, records, stdout, never_failed)
