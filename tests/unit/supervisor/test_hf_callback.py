"""``DssupCallback`` inside a real transformers ``Trainer`` (CPU, one process, a tiny random
GPT-2): what it reports on a fresh start, on each save, at the end, and after a resume."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.torch


def _trainer(out, callback, max_steps):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (64, 16), generator=gen)]
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=max_steps, save_steps=1, use_cpu=True, report_to=[], logging_steps=1,
        disable_tqdm=True, dataloader_drop_last=True,
    )  # fmt: skip
    return Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=data, callbacks=[callback])


def test_the_callback_reports_start_saves_completion_and_the_resumed_step(tmp_path, monkeypatch):
    from dssup.jobreport import CheckpointSaved, Completed, Started, read_report
    from dssup.runtime.hf import DssupCallback

    report = tmp_path / "report.jsonl"
    monkeypatch.setenv("DSSUP_REPORT_FILE", str(report))
    monkeypatch.setenv("DSSUP_ATTEMPT", "1")
    _trainer(tmp_path / "out", DssupCallback(), max_steps=2).train()
    first = read_report(report)
    assert first.problems == ()
    start = first.of(Started)[0]
    assert (start.micro_batch, start.grad_accum, start.dp, start.global_batch) == (4, 2, 1, 8)
    assert (start.first_step, start.framework, start.recompute) == (0, "hf-trainer", "none")
    assert [c.step for c in first.of(CheckpointSaved)] == [1, 2]
    assert first.of(CheckpointSaved)[0].path.endswith("checkpoint-1")
    assert [c.step for c in first.of(Completed)] == [2]

    report.unlink()
    monkeypatch.setenv("DSSUP_ATTEMPT", "2")
    resumed = _trainer(tmp_path / "out", DssupCallback(), max_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    again = read_report(report).of(Started)[0]
    assert (again.first_step, again.attempt) == (2, 2)


def test_without_dssup_the_callback_writes_nothing(tmp_path, monkeypatch):
    from dssup.runtime.hf import DssupCallback

    monkeypatch.delenv("DSSUP_REPORT_FILE", raising=False)
    _trainer(tmp_path / "out", DssupCallback(), max_steps=1).train()
    assert not list(tmp_path.glob("*.jsonl"))
