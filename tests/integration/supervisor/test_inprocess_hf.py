"""In-process OOM recovery of a stock Hugging Face ``Trainer`` (``guarded(Trainer)``) through
the real ``dssup run``, real torchrun with two gloo ranks and a real allocator failure.

``examples/train_hf_guarded.py``: a tiny random-init Llama (eager attention, 512 tokens per
sample) with the stock Trainer, global batch 32 = 16 per device x 2 ranks. In step 2 rank 1
alone caps its address space at what its micro-batch of 16 holds when the logits exist, plus
1 MiB (``--cap_at forward``: the loss then cannot be allocated, on any machine; a micro-batch
of 8 holds about half). Both ranks redo step 2 as two micro-batches of 8, no restart, and the
weights equal those of the same stock Trainer run in one process with the whole global batch
per step (measured equal to the two-rank stock run within 1.3e-8).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from inproc_helpers import MALLOC, attempts, relative_l2, run_dssup
from sup_helpers import ROOT, of

pytest.importorskip("transformers")
pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

SCRIPT = ROOT / "examples" / "train_hf_guarded.py"
HF = ["--use_cpu", "--seq_len", "512", "--max_steps", "3", "--save_strategy", "no",
      "--report_to", "none"]  # fmt: skip


def test_a_guarded_trainer_redoes_the_oom_step_in_process(tmp_path):
    ref = tmp_path / "ref.pt"
    subprocess.run(
        [sys.executable, str(SCRIPT), *HF, "--output_dir", str(tmp_path / "ref"),
         "--per_device_train_batch_size", "32", "--no_guard", "--weights_out", str(ref)],
        check=True, timeout=240, capture_output=True, env={**os.environ, **MALLOC},
    )  # fmt: skip
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "32", "--", "torchrun", "--standalone", "--nproc-per-node",
        "2", str(SCRIPT), *HF, "--output_dir", str(tmp_path / "out"), "--ddp_backend", "gloo",
        "--per_device_train_batch_size", "16", "--cap_at", "forward", "--cap_from_step", "2",
        "--cap_ranks", "1", "--weights_out", str(out),
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert len(attempts(rec)) == 1
    (remedy,) = of(rec, "inprocess-remedy")
    assert (remedy["step"], remedy["oom_ranks"], remedy["oom_phases"]) == (2, [1], ["forward"])
    assert (remedy["old_micro_batch"], remedy["micro_batch"], remedy["grad_accum"]) == (16, 8, 2)
    assert sorted(remedy["reported_by"]) == [0, 1]
    report = of(rec, "job-report")[0]
    assert report["batch"]["status"] == "verified" and report["batch"]["reported"] == [32]
    assert relative_l2(torch.load(out), torch.load(ref)) < 1e-5
