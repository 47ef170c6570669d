"""A failure after training is a success only when the final save is seen whole.

The Hugging Face Trainer prints "Training completed." (and calls ``on_train_end``) before the
script's own ``save_model``/``save_state``. These tests write real model files with the real
writers (``safetensors``, ``torch.save``), cut some short as a killed writer or a full disk
leaves them, and check what dssup concludes: ``teardown`` (success) with a whole final save,
``unverified-end`` (trained, not relaunched, not a success) without one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dssup.jobreport import ENV_VAR
from dssup.runtime.report import report_completed
from dssup.supervisor.classify import classify
from dssup.supervisor.command import parse_command
from dssup.supervisor.evidence import collect
from dssup.supervisor.frameworks.final_save import final_save
from dssup.supervisor.handoff import build_handoff
from dssup.supervisor.jobview import JobView
from dssup.supervisor.models import Failure, FailureKind, RankFailure
from dssup.supervisor.report import report_path

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = Path(__file__).resolve().parents[3]
RUN_CLM = ROOT / "examples" / "hf" / "run_clm.py"
DONE = "Training completed. Do not forget to share your model on huggingface.co/models =)"
ABORT = Failure(kind=FailureKind.TRANSIENT, rank=1, exit_code=1, signature="SIGABRT",
                message="terminate called without an active exception")  # fmt: skip


def _weights() -> dict:
    return {"wte": torch.ones(64, 32), "h.0.w": torch.arange(32.0), "lm_head": torch.zeros(8, 8)}


def _cut(path: Path, keep: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def _state(path: Path, step: int = 8, last: int = 8) -> None:
    path.write_text(json.dumps({"global_step": step, "max_steps": last}))


def _view(tmp_path: Path, *args: str) -> JobView:
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", str(RUN_CLM), *args], env={})
    return JobView(*build_handoff(cmd, (), None, tmp_path))


def test_whole_and_cut_safetensors_are_told_apart_by_their_framing(tmp_path):
    since = time.time() - 1
    safetensors_torch.save_file(_weights(), str(tmp_path / "model.safetensors"))
    assert final_save(tmp_path, since).whole == ("model.safetensors",)
    size = (tmp_path / "model.safetensors").stat().st_size
    _cut(tmp_path / "model.safetensors", size - 1)
    (broken,) = final_save(tmp_path, since).broken
    assert f"{size - 1} of the {size} bytes its header describes" in broken
    _cut(tmp_path / "model.safetensors", 20)  # inside the header
    assert "header of" in final_save(tmp_path, since).broken[0]
    _cut(tmp_path / "model.safetensors", 3)
    assert "shorter than its 8-byte header length" in final_save(tmp_path, since).broken[0]


def test_only_files_this_attempt_wrote_count(tmp_path):
    safetensors_torch.save_file(_weights(), str(tmp_path / "model.safetensors"))
    _cut(tmp_path / "model.safetensors", 100)  # a cut file from an earlier run: not this one's
    old = time.time() - 3600
    os.utime(tmp_path / "model.safetensors", (old, old))
    (tmp_path / "notes.bin").write_bytes(b"not a model")  # not a model file name
    found = final_save(tmp_path, time.time() - 60)
    assert found.whole == () and found.broken == ()
    assert final_save(tmp_path / "absent", 0.0).whole == ()


def test_a_sharded_save_is_judged_by_its_index(tmp_path):
    since = time.time() - 1
    shards = {"model-00001-of-00002.safetensors": {"a": torch.ones(16)},
              "model-00002-of-00002.safetensors": {"b": torch.ones(16)}}  # fmt: skip
    for name, tensors in shards.items():
        safetensors_torch.save_file(tensors, str(tmp_path / name))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert final_save(tmp_path, since).whole == ("model.safetensors.index.json (2 whole shards)",)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()  # killed before the last shard
    (broken,) = final_save(tmp_path, since).broken
    assert (
        broken.startswith("model.safetensors.index.json: model-00002-of-00002")
        and "missing" in broken
    )
    (tmp_path / "model.safetensors.index.json").unlink()  # killed before the index
    found = final_save(tmp_path, since)
    assert found.whole == ()
    assert found.broken == (
        "model-00001-of-00002.safetensors: a shard with no index written by this attempt",
    )


def test_a_torch_save_archive_is_whole_only_with_its_central_directory(tmp_path):
    since = time.time() - 1
    torch.save(_weights(), tmp_path / "pytorch_model.bin")
    assert final_save(tmp_path, since).whole == ("pytorch_model.bin",)
    size = (tmp_path / "pytorch_model.bin").stat().st_size
    _cut(tmp_path / "pytorch_model.bin", size // 2)
    assert "not a whole torch.save archive" in final_save(tmp_path, since).broken[0]


def test_after_training_an_abort_is_a_teardown_only_with_a_whole_final_save(tmp_path):
    out = tmp_path / "out"
    view = _view(tmp_path, "--output_dir", str(out))
    since = time.time() - 1
    # still training when it failed: the failure stands
    assert view.finished(ABORT, since, "{'loss': 2.1}") == ABORT
    # nothing written after training: trained, but the end is unverified (not a success)
    got = view.finished(ABORT, since, DONE)
    assert got is not None and got.kind == FailureKind.UNVERIFIED_END and not got.retryable
    assert "terminate called" in got.message and "final save is unverified" in got.message
    assert "wrote no trainer_state.json and no model file" in got.evidence[-1]
    # the script's save_model and save_state both ran: success
    out.mkdir()
    safetensors_torch.save_file(_weights(), str(out / "model.safetensors"))
    _state(out / "trainer_state.json")
    got = view.finished(ABORT, since, DONE)
    assert got is not None and got.kind == FailureKind.TEARDOWN
    assert "Training completed" in got.evidence[-2]
    assert (
        "written by this attempt with global_step >= max_steps; model.safetensors whole"
        in got.evidence[-1]
    )
    # the model alone, whole, is the script's product: success, saying what was checked
    (out / "trainer_state.json").unlink()
    got = view.finished(ABORT, since, DONE)
    assert got is not None and got.kind == FailureKind.TEARDOWN
    assert "model.safetensors" in got.evidence[-1] and "headers and sizes agree" in got.evidence[-1]
    # a cut model file beside a finished trainer_state.json: never a success
    _state(out / "trainer_state.json")
    _cut(out / "model.safetensors", 64)
    got = view.finished(ABORT, since, DONE)
    assert got is not None and got.kind == FailureKind.UNVERIFIED_END
    assert "cut short: model.safetensors" in got.evidence[-1]


def test_an_old_final_state_is_not_this_attempts_save(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _state(out / "trainer_state.json")
    old = time.time() - 3600
    os.utime(out / "trainer_state.json", (old, old))
    got = _view(tmp_path, "--output_dir", str(out)).finished(ABORT, time.time() - 1, DONE)
    assert got is not None and got.kind == FailureKind.UNVERIFIED_END


def test_json_arguments_are_read_for_the_output_dir(tmp_path):
    out = tmp_path / "from-json"
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(out), "max_steps": 8}))
    view = _view(tmp_path, str(tmp_path / "args.json"))
    assert view.framework.checkpoint_dir(view.job) == (
        out,
        f"output_dir in {tmp_path / 'args.json'}",
    )
    out.mkdir()
    safetensors_torch.save_file(_weights(), str(out / "model.safetensors"))
    got = view.finished(ABORT, time.time() - 5, DONE)
    assert got is not None and got.kind == FailureKind.TEARDOWN


def _report(attempt: Path, *, final: bool, ranks: tuple[int, ...] = (0, 1)) -> None:
    for rank in ranks:
        env = {ENV_VAR: str(report_path(attempt)), "RANK": str(rank), "DSSUP_ATTEMPT": "1"}
        assert report_completed(8, env=env, final=final, source="test")


def test_a_training_loops_end_in_the_report_is_not_the_scripts_end(tmp_path):
    attempt = tmp_path / "attempt-001"
    attempt.mkdir()
    _report(attempt, final=False)  # DssupCallback.on_train_end on both ranks
    ev = collect(attempt, 1, "", world_size=2)
    assert ev.done_ranks == set()
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", str(script)], env={})
    view = JobView(*build_handoff(cmd, (), None, tmp_path))
    assert view.framework.name == "plain"
    got = view.finished(ABORT, time.time() - 1, "", attempt)
    assert got is not None and got.kind == FailureKind.UNVERIFIED_END
    assert "rank(s) [0, 1] reported the end of the training loop" in got.evidence[-2]
    assert "clean_exit()" in got.evidence[-1]
    # the script's own end on every rank (clean_exit / mark_done): a teardown, as before
    _report(attempt, final=True)
    ev = collect(attempt, 1, "", world_size=2)
    assert ev.done_ranks == {0, 1}
    assert (failure := classify(ev)) is not None and failure.kind == FailureKind.TEARDOWN


def test_an_exception_of_the_script_after_its_final_save_is_not_a_teardown(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    safetensors_torch.save_file(_weights(), str(out / "model.safetensors"))
    _state(out / "trainer_state.json")
    view = _view(tmp_path, "--output_dir", str(out))
    # rank 0's evaluation after save_state raised: its traceback propagated out of the script
    raised = Failure(kind=FailureKind.TRANSIENT, rank=0, exit_code=1, signature="unknown",
                     message="RuntimeError: eval dataset is empty",
                     ranks=(RankFailure(rank=0, exit_code=1, sources=("stderr", "uncaught-traceback")),))  # fmt: skip
    got = view.finished(raised, time.time() - 5, DONE)
    assert got is not None and got.kind == FailureKind.UNVERIFIED_END
    assert "final save is whole, but the script then raised" in got.message
    assert got.evidence[-2].startswith("final save: ") and "uncaught-traceback" in got.evidence[-1]
    # the same failure as a signal at exit, no exception: the exit flake, a teardown
    flake = raised.model_copy(
        update={"ranks": (RankFailure(rank=0, exit_code=-6, sources=("stderr",)),)}
    )
    got = view.finished(flake, time.time() - 5, DONE)
    assert got is not None and got.kind == FailureKind.TEARDOWN
