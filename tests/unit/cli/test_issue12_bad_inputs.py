"""Every bad input of issue 12 as a user meets it: a real ``python -m dssup`` process, one line
on stderr naming the flag and the fix, exit status 2, nothing on stdout, never a traceback.

The cases: PP > 1 with neither a global batch nor an accumulation (``estimate``; ``plan``
requires the global batch), a bare number for a size (GPU and host memory), DualPipe with PP = 1
or on a dense model, VPP with PP = 1, dtype keys that would change nothing, a binary file (or a
folder whose config.json is binary, or a device) passed as ``--model``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

ROOT = Path(__file__).parents[3]
BINARY = "binary"  # replaced by a real binary file in the test

CASES = [
    (
        "pp-without-batch",
        ["estimate", "--model", "deepseek-v3", "--pp", "16"],
        "--global-batch-size",
        "pass --global-batch-size (or --grad-accum)",
    ),
    (
        "plan-pp-without-batch",
        ["plan", "--model", "deepseek-v3", "--gpus", "64", "--pp", "16", "--gpu-memory", "H100"],
        "--global-batch-size",
        "add --global-batch-size",
    ),
    (
        "bare-gpu-memory",
        ["estimate", "--gpu-memory", "80"],
        "--gpu-memory",
        "80: did you mean 80GiB?; write a unit",
    ),
    (
        "plan-bare-gpu-memory",
        ["plan", "--gpus", "64", "--global-batch-size", "64", "--gpu-memory", "80"],
        "--gpu-memory",
        "80: did you mean 80GiB?",
    ),
    (
        "bare-host-memory",
        ["estimate", "--host-memory", "2048"],
        "--host-memory",
        "2048: did you mean 2048GiB?; write a unit (80GiB, 80GB, 512MiB, 1024B)",
    ),
    (
        "dualpipe-pp1",
        ["estimate", "--pp", "1", "--schedule", "dualpipe"],
        "--schedule",
        "set --pp 2 or more",
    ),
    (
        "dualpipe-dense",
        [
            "estimate",
            "--model",
            "llama-3-8b",
            "--pp",
            "2",
            "--schedule",
            "dualpipe",
            "--grad-accum=8",
        ],
        "--schedule",
        "use --schedule 1f1b or interleaved for a dense model",
    ),
    ("vpp-pp1", ["estimate", "--vpp", "2"], "--vpp", "set --pp 2 or more"),
    (
        "interleaved-pp1",
        ["estimate", "--pp", "1", "--vpp", "2", "--schedule", "interleaved"],
        "--vpp",
        "set --pp 2 or more",
    ),
    (
        "fp8-activations-transformers",
        ["estimate", "--framework", "transformers", "--dtypes", "activations=fp8"],
        "--dtypes",
        "drop activations=fp8",
    ),
    (
        "fp8-activations-paper",
        ["estimate", "--convention", "paper", "--dtypes", "activations=fp8"],
        "--dtypes",
        "FP8 caching would change nothing",
    ),
    (
        "fp8-precision-paper",
        ["estimate", "--convention", "paper", "--precision", "fp8"],
        "--dtypes",
        "use --convention megatron",
    ),
    (
        "fp8-weights",
        ["estimate", "--dtypes", "weights=fp8"],
        "--dtypes",
        "use fp8 only for activations",
    ),
    ("unknown-dtype-key", ["estimate", "--dtypes", "foo=bf16"], "--dtypes", "use key=dtype"),
    ("binary-model", ["estimate", "--model", BINARY], "--model", "is a binary file"),
    ("binary-model-folder", ["estimate", "--model", "FOLDER"], "--model", "is a binary file"),
    ("device-model", ["estimate", "--model", "/dev/null"], "--model", "is not a regular file"),
]


def _dssup(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this worktree's code
    return dssup_cli(*args, timeout=120, env=env)


@pytest.mark.parametrize(("case", "args", "flag", "fix"), CASES, ids=[c[0] for c in CASES])
def test_one_line_naming_the_flag_and_the_fix(
    case: str, args: list[str], flag: str, fix: str, tmp_path: Path
) -> None:
    weights = tmp_path / "model.safetensors"  # a real binary: a safetensors header and zeros
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(64))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_bytes(bytes(range(256)))
    args = [str(weights) if a == BINARY else str(folder) if a == "FOLDER" else a for a in args]
    out = _dssup(args)
    assert out.returncode == 2, (case, out.stdout, out.stderr)
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"dssup: error: {flag}: "), lines[0]
    assert fix in lines[0], lines[0]
