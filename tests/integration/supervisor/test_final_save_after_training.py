"""After "Training completed.", dssup calls a failure a teardown only when the final save is
whole: a real HF Trainer under real torchrun (2 gloo ranks), its end cut by the kernel.

``hf_final_save.py`` trains 2 steps, then (1) has rank 0's final ``save_model`` stopped by
``RLIMIT_FSIZE`` (the writer's EFBIG error, or the kernel's SIGXFSZ in the middle of the
write; either way no ``model.safetensors``, as safetensors renames a finished temporary file),
or (2) has rank 1 abort after every save is done. Cut files (torch.save, older writers,
shards without their index) are in tests/unit/supervisor/test_final_save.py. (1) must end ``unverified-end``: not "succeeded", not relaunched (it would train
again), a non-zero exit, the cut file named. (2) is the exit flake: "succeeded", saying which
final save was checked.
"""

from __future__ import annotations

import pytest

from tests.integration.supervisor.sup_helpers import WORKERS, dssup_run, journal, of, torchrun
from tests.memprobe import HEAP

pytestmark = [
    pytest.mark.integration,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]
pytest.importorskip("transformers")

SCRIPT = str(WORKERS / "hf_final_save.py")


def _run(tmp_path, **env: str):
    out, run = tmp_path / "out", tmp_path / "run"
    args = ["--output_dir", str(out), "--per_device_train_batch_size", "2", "--max_steps", "2",
            "--save_steps", "2", "--use_cpu", "--ddp_backend", "gloo", "--report_to", "none",
            "--disable_tqdm", "true", "--logging_steps", "1"]  # fmt: skip
    res = dssup_run(run, "--global-batch-size", "4", *torchrun(SCRIPT, *args), timeout=600,
                    env={"HF_HUB_OFFLINE": "1", **HEAP, **env})  # fmt: skip
    return res, journal(run), out


@pytest.mark.parametrize("killed", [False, True], ids=["write-error", "killed-mid-write"])
def test_a_final_save_that_failed_is_not_called_a_success(tmp_path, killed):
    env = {"FINAL_SAVE_FSIZE": "4096", **({"FINAL_SAVE_KILLED": "1"} if killed else {})}
    res, records, out = _run(tmp_path, **env)
    assert res.returncode != 0, res.stdout[-3000:]
    (end,) = of(records, "attempt-ended")  # one attempt: a finished run is not trained again
    failure = end["failure"]
    assert failure["kind"] == "unverified-end", failure
    assert "Training completed" in failure["evidence"][-2]
    # safetensors writes a temporary file and renames it: stopped, it leaves no model file
    assert not (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert "wrote no trainer_state.json and no model file" in failure["evidence"][-1]
    signature = "SIGXFSZ" if killed else "unknown"  # killed by the kernel, or an I/O error
    assert failure["signature"] == signature and failure["rank"] == 0, failure
    (ended,) = of(records, "run-ended")
    assert ended["outcome"] == "unverified-end" and ended["exit_code"] == res.returncode
    assert "the last complete checkpoint is step 2" in ended["reason"]
    assert "succeeded" not in res.stdout + res.stderr


def test_an_abort_after_a_whole_final_save_is_the_exit_flake(tmp_path):
    res, records, _ = _run(tmp_path, FINAL_ABORT_RANK="1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (end,) = of(records, "attempt-ended")
    assert end["failure"]["kind"] == "teardown" and end["failure"]["rank"] == 1, end["failure"]
    saved = end["failure"]["evidence"][-1]
    assert saved.startswith("final save: ") and "trainer_state.json" in saved
    assert "model.safetensors whole" in saved
    assert of(records, "run-ended")[0]["outcome"] == "succeeded"
