"""``dssup estimate`` / ``plan`` for pipeline schedules and frameworks, and the bad inputs of
issue 12 item 6: one line naming the flag and the fix, exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from dssup.cli import main

V3 = ["--model", "deepseek-v3", "--tp", "1", "--pp", "16", "--ep", "64", "--dp", "128"]
SPLIT = ",".join(["3", *["4"] * 14, "2"])
RECIPE = [
    *V3,
    "--schedule",
    "dualpipe",
    "--layers-per-stage",
    SPLIT,
    "--global-batch-size",
    "15360",
    "--zero",
    "1",
    "--gpu-memory",
    "84943110144B",  # an H800's totalGlobalMem (deepseek-ai/profile-data train.json)
]


def test_deepseek_v3_recipe_fits_and_shows_the_stages_each_device_holds() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dssup",
            "estimate",
            *RECIPE,
            "--precision",
            "fp8",
            "--dtypes",
            "moments=bf16",
            "--framework",
            "deepseek",
            "--recompute",
            "selective",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split()[:3] == ["device", "stages", "layers"]
    assert lines[3].split()[1:4] == ["0+15", "0-2,59-60", "4.93"]
    assert "16+1" in lines[3] and "1+16" in lines[18]
    assert "FITS" in out.stdout and "DOES NOT FIT" not in out.stdout
    assert "stage j keeps PP - j micro-batches" in out.stdout


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["estimate", *args])
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), (
        res.exception
    )
    return res.exit_code, res.output


def test_bf16_without_recompute_does_not_fit() -> None:
    code, out = _run(*RECIPE, "--dtypes", "moments=bf16", "--framework", "deepseek")
    assert code == 1
    assert "DOES NOT FIT" in out


BAD = [
    (["--pp", "2"], "--global-batch-size", "pass --global-batch-size (or --grad-accum)"),
    (["--pp", "1", "--schedule", "dualpipe"], "--schedule", "set --pp 2 or more"),
    (["--vpp", "2"], "--vpp", "set --pp 2 or more"),
    (
        ["--model", "llama-3-8b", "--pp", "2", "--schedule", "dualpipe", "--grad-accum", "8"],
        "--schedule",
        "use --schedule 1f1b or interleaved for a dense model",
    ),
    (["--pp", "3", "--schedule", "dualpipe", "--grad-accum", "8"], "--pp", "use an even --pp"),
    (
        ["--pp", "4", "--schedule", "dualpipe", "--grad-accum", "6"],
        "--grad-accum",
        "raise --global-batch-size",
    ),
    (
        ["--model", "llama-3-8b", "--pp", "4", "--vpp", "2", "--grad-accum", "6"],
        "--grad-accum",
        "use a multiple of 4 micro-batches",
    ),
    (["--framework", "transformers", "--dtypes", "activations=fp8"], "--dtypes", "drop"),
    (["--convention", "paper", "--precision", "fp8"], "--dtypes", "--convention megatron"),
    (["--dtypes", "weights=fp8"], "--dtypes", "use fp8 only for activations"),
    (["--recompute", "selective", "--recompute-modules", "foo"], "--recompute-modules", "use"),
    (
        ["--recompute", "full", "--recompute-modules", "core_attn"],
        "--recompute-modules",
        "drop --recompute-modules or use --recompute selective",
    ),
    (
        ["--model", "llama-3-8b", "--recompute", "selective", "--recompute-modules", "mla_up_proj"],
        "--recompute-modules",
        "drop it",
    ),
    (["--framework", "transformers", "--recompute", "selective"], "--recompute", "use"),
    (["--framework", "transformers", "--pp", "2", "--grad-accum", "4"], "--pp", "use --pp 1"),
    (["--model", "llama-3-8b", "--mtp"], "--mtp", "drop --mtp"),
    (["--attention", "sdpa"], "--attention", "use --attention flash or eager"),
    (
        ["--recompute", "selective", "--recompute-num-layers", "2"],
        "--recompute-num-layers",
        "drop --recompute-num-layers or use --recompute full",
    ),
    (["--convention", "paper", "--framework", "megatron"], "--framework", "drop --framework"),
]


@pytest.mark.parametrize(("args", "flag", "fix"), BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_bad_input_is_one_line_naming_the_flag(args: list[str], flag: str, fix: str) -> None:
    code, out = _run(*args)
    assert code == 2, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith(f"dssup: error: {flag}: "), lines[0]
    assert fix in lines[0]
    assert "Traceback" not in out


def test_bad_input_in_a_real_process_has_no_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dssup", "estimate", "--pp", "1", "--schedule", "dualpipe"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_dtypes_apply_on_top_of_the_conventions_own_precision() -> None:
    """``--dtypes`` without ``--precision`` starts from the convention's default: under
    ``--convention paper`` that is BF16 moments, so restating a default changes no byte (it
    used to reset the moments to FP32 behind the user's back)."""
    v3 = ["--model", "deepseek-v3", "--convention", "paper", "--tp", "2", "--pp", "16"]
    v3 += ["--ep", "8", "--dp", "32", "--grad-accum", "32", "--json"]
    code, plain = _run(*v3)
    assert code == 0
    for same in ("activations=bf16", "moments=bf16", "grads=fp32,weights=bf16"):
        code, out = _run(*v3, "--dtypes", same)
        assert code == 0 and out == plain, same
    code, out = _run(*v3, "--dtypes", "moments=fp32")
    assert code == 0 and out != plain


def test_plan_lists_the_deepseek_v3_recipe_among_the_fitting_configs() -> None:
    """``dssup plan`` for the recipe's layout on an H800 (79.11 GiB that CUDA can allocate):
    with the default options (no margin: context, buffers and fragmentation are modelled) the
    recipe (micro-batch 1 x 120, DeepSeek's selective recompute, ZeRO-1, no offload) is among
    the fitting rows, marked near the limit, at the bytes ``estimate`` gives; a user's 2 %
    margin leaves it out (78.0 of 79.11 GiB); with BF16 activations no row without recompute
    fits."""
    args = ["plan", "--model", "deepseek-v3", "--gpus", "2048", "--tp", "1", "--pp", "16"]
    args += ["--ep", "64", "--schedule", "dualpipe", "--layers-per-stage", SPLIT]
    args += ["--global-batch-size", "15360", "--framework", "deepseek", "--gpu-memory", "H800"]
    args += ["--top", "100", "--json"]
    fp8 = ["--precision", "fp8", "--dtypes", "moments=bf16"]

    def rows(*extra: str) -> list[dict[str, Any]]:
        res = CliRunner().invoke(main, [*args, *extra])
        assert res.exit_code in (0, 1), res.output
        return list(json.loads(res.output)["candidates"])

    def recipe(r: dict[str, Any]) -> bool:
        t = r["training"]
        return (t["micro_batch"], t["grad_accum"], t["recompute"], t["zero_stage"]) == (
            1,
            120,
            "selective",
            1,
        ) and not (t["offload_optimizer"] or t["offload_params"])

    found = [r for r in rows(*fp8) if recipe(r)]
    assert len(found) == 1 and found[0]["fits"] and found[0]["near_limit"]
    code, out = _run(
        *RECIPE[:-2], "--gpu-memory", "H800", *fp8, "--framework", "deepseek",
        "--recompute", "selective", "--json",
    )  # fmt: skip
    assert code == 0 and json.loads(out)["peak_bytes"] == found[0]["peak_bytes"]
    assert json.loads(out)["near_limit"] is True
    assert not [r for r in rows(*fp8, "--margin", "0.02") if recipe(r)]
    plain = rows("--dtypes", "moments=bf16")
    assert not [r for r in plain if r["training"]["recompute"] == "none"]
