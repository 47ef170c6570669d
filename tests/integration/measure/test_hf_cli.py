"""``dssup measure --hf``: a real child process, a real config file, a real transformers model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.integration, pytest.mark.torch]

LLAMA = Path(__file__).resolve().parents[3] / "bench" / "hf_models" / "llama-gqa-tiny.json"


def _dssup(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=600)


def test_measure_hf_runs_the_transformers_model_and_cross_checks() -> None:
    out = _dssup(
        "measure", "--hf", str(LLAMA), "--layers", "1", "--seq-len", "64", "-b", "8",
        "--attn", "eager", "--recompute", "full", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["mode"] == "real" and res["run"]["knobs"]["checkpointing"] is True
    assert res["run"]["source"]["config"]["num_hidden_layers"] == 1
    assert res["blocks"] == {"dense": 1} and "model.layers" in res["found"]
    assert abs(res["profiler_peak_bytes"] - res["peak_bytes"]) <= res["profiler_allowance_bytes"]
    assert res["versions"]["transformers"] == "5.23.0"
    assert res["phase"] in {"forward", "backward", "optimizer"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hf", str(LLAMA), "--dp", "2"], "--dp: applies to --model"),
        (["--hf", str(LLAMA), "--recompute", "selective"], "--recompute: selective"),
        (["--model", "llama-3-8b", "--attn", "eager"], "--attn: applies to --hf only"),
        (["--hf", str(LLAMA), "--model", "llama-3-8b"], "exactly one model source"),
        (["--hf", "/nonexistent/config.json"], "is not a config.json"),
        (["--module", "no_such_pkg.mod:factory"], "--module: cannot import"),
        ([], "no model given"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _dssup("measure", *args)
    assert out.returncode == 2, out
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
