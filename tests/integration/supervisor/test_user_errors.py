"""User errors are never retried: a misspelt script path, an argparse error and an HF argument
error each end the run after one attempt, with the message kept (real torchrun, real scripts)."""

import pytest
from sup_helpers import ROOT, WORKERS, dssup_run, journal, of

from tests.memprobe import MALLOC  # the capped workers' glibc settings, not the caller's

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]


def _once(tmp_path, *command: str):
    run = tmp_path / "run"
    res = dssup_run(run, "--global-batch-size", "32", "--", "torchrun", "--standalone",
                    "--nproc-per-node", "2", *command, env=MALLOC)  # fmt: skip
    rec = journal(run)
    assert len(of(rec, "attempt-started")) == 1, res.stdout[-3000:]
    assert of(rec, "decision") == []
    failure = of(rec, "attempt-ended")[0]["failure"]
    assert failure["kind"] == "user-error"
    assert "not retried" in of(rec, "run-ended")[0]["reason"]
    assert res.returncode not in (0, 3)
    return failure


def test_a_misspelt_script_path_is_not_retried(tmp_path):
    failure = _once(tmp_path, str(WORKERS / "trian.py"))
    assert failure["signature"] == "missing-script"
    assert "can't open file" in failure["message"] and "trian.py" in failure["message"]


def test_an_argparse_error_is_not_retried(tmp_path):
    failure = _once(tmp_path, str(WORKERS / "argparse_only.py"), "--lr-warmup", "3")
    assert failure["signature"] == "argparse"
    assert "unrecognized arguments: --lr-warmup 3" in failure["message"]


def test_an_hf_argument_error_is_not_retried(tmp_path):
    pytest.importorskip("transformers")
    script = str(ROOT / "examples" / "hf" / "run_clm.py")
    failure = _once(tmp_path, script, "--output_dir", str(tmp_path / "out"), "--do_train",
                    "--per_device_train_batch_sise", "16")  # fmt: skip
    assert failure["signature"] == "hf-arguments"
    assert "--per_device_train_batch_sise" in failure["message"]
