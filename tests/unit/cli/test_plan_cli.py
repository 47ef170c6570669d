"""``dssup plan`` as a user runs it: bad input refused in one line, searched options pin the
search, every hardware figure printed, row N explained, and the closest miss named honestly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dssup.cli import main
from dssup.memory import preset
from dssup.memory.splits import split_family

MIXTRAL = preset("mixtral-8x7b")
L8 = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64"]


def invoke(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--zero-stages", "5"], "--zero-stages: 5 is not a ZeRO stage; use stages from 0,1,2,3"),
        (["--zero-stages", "1,x"], "--zero-stages: cannot read"),
        (["--zero", "5"], "--zero: 5 is out of range; use a whole number from 0 to 3"),
        (["--zero", "1", "--zero-stages", "2,3"], "--zero: --zero 1 conflicts"),
        (["--grad-accum", "4"], "--grad-accum: plan derives it"),
        (["--offload", "optimizer", "--no-offload"], "--offload: conflicts with --no-offload"),
        (["--margin", "1.5"], "--margin: 1.5 is out of range; use a number from 0 below 1"),
        (["--explain", "0"], "--explain: 0 is out of range; use a whole number from 1"),
        (["--fixed-layout", "--explain", "500"], "--explain: row 500 does not exist"),
        (["--compute-dtype", "fp8", "--gpu", "a100-80gb"], "--compute-dtype"),
        (["--gpu", "h999"], "--gpu: unknown GPU 'h999'"),
        (["--offload", "optimizer", "--gpu", "h800"], "--host-cores"),
        (["--micro-batch", "3"], "--micro-batch: 3 does not divide the 8 sequences per DP rank"),
        (["--search-parallelism", "--tp", "16"], "--tp: no valid layout for 8 GPUs with --tp 16"),
        (["--tp", "3"], "--tp: no valid layout for 8 GPUs with --tp 3"),
        (["--fixed-layout", "--tp", "3"], "--world-size: 8 GPUs is not a multiple of tp*pp*cp=3"),
        (["--recompute", "partial"], "--recompute: 'partial' is not a choice; use one of none, selective, full"),
        (["--search-parallelism", "--layers-per-stage", "4,4"],
         "--layers-per-stage: sums to 8, the model has 32 layers"),
        (["--layers-per-stage", "4,x"], "--layers-per-stage: cannot read '4,x'"),
        (["--search-parallelism", "--layers-per-stage", "8,8,8,7,1", "--vpp", "2"],
         "--layers-per-stage: 5 entries do not make whole stages of --vpp 2 chunks"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    """In a real process (what a user sees): one line naming the flag and the fix, exit 2."""
    out = subprocess.run(
        [sys.executable, "-m", "dssup", *L8, "--gpu-memory", "H100", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert not out.stdout.strip(), out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "7", "--fixed-layout"],
         "--global-batch-size: 7 is not a multiple of DP = 8"),
        (["--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "32", "--pp", "8",
          "--ep", "8", "--schedule", "dualpipe", "--fixed-layout"],
         "--global-batch-size: DualPipe needs an even"),
        (["--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "32", "--pp", "8",
          "--ep", "8", "--schedule", "dualpipe", "--tp", "1"],
         "--global-batch-size: DualPipe needs an even"),
    ],
)  # fmt: skip
def test_impossible_batches_are_refused(args: list[str], needle: str) -> None:
    code, _, err = invoke("plan", *args, "--gpu-memory", "H100")
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_usage_error_one_line_in_a_real_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dssup", *L8, "--gpu-memory", "H100", "--zero", "7"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--zero" in out.stderr and "Traceback" not in out.stderr


def test_searched_options_pin_the_search() -> None:
    code, out, err = invoke(
        *L8, "--gpu-memory", "H100", "--micro-batch", "2", "--recompute", "full", "--zero", "1",
        "--offload", "none", "--json",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert rows
    for c in rows:
        t = c["training"]
        assert (t["micro_batch"], t["recompute"], t["zero_stage"]) == (2, "full", 1)
        assert not t["offload_optimizer"]
    code, out, err = invoke(
        "plan", "--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256",
        "--gpu-memory", "H100", "--search-parallelism", "--tp", "2", "--schedule", "dualpipe",
        "--pp", "4", "--json", "--top", "200",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert rows and all(
        (c["layout"]["tp"], c["layout"]["pp"], c["layout"]["schedule"]) == (2, 4, "dualpipe")
        for c in rows
    )
    assert {c["layout"]["ep"] for c in rows} != {1}  # EP is still searched


def test_a_split_names_its_own_pp_without_pinning_the_search() -> None:
    """--layers-per-stage with --search-parallelism: the layouts with the split's PP (1F1B and
    DualPipe) use it, other PPs are still searched, with the splits of splits.py."""
    split = "2,4,4,4,4,4,4,4,2"  # Mixtral's 32 layers over 9 stages: PP 9
    code, _, err = invoke(
        "plan", "--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256",
        "--gpu-memory", "H100", "--search-parallelism", "--layers-per-stage", split, "--json",
    )  # fmt: skip
    assert code == 2 and "--layers-per-stage" in err  # 9 stages do not divide 64 GPUs
    split = "5,4,4,4,4,4,4,3"
    code, out, err = invoke(
        "plan", "--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256",
        "--gpu-memory", "H100", "--search-parallelism", "--layers-per-stage", split,
        "--json", "--top", "100000",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["candidates"]
    assert {c["layout"]["pp"] for c in rows} - {8}  # PP is not pinned by the split
    used = 0
    for c in rows:
        lay = c["layout"]
        own = (lay["pp"], lay["vpp"]) == (8, 1)
        family = split_family(MIXTRAL, lay["pp"], lay["vpp"], lay["schedule"], True)
        searched = [None if s.counts is None else list(s.counts) for s in family]
        assert (
            lay["layers_per_stage"] == [5, 4, 4, 4, 4, 4, 4, 3]
            if own
            else (lay["layers_per_stage"] in searched)
        ), lay
        used += own
    assert used


def test_explain_prints_every_term_and_every_hardware_figure() -> None:
    code, out, err = invoke(
        *L8, "--gpu-memory", "H100", "--compute-dtype", "fp8", "--explain", "2", "--top", "3"
    )
    assert code == 0, err
    assert "row 2:" in out and "tokens/s/GPU" in out
    for term in ("compute.gemm", "pipeline.bubble", "comm.dp_grads", "optimizer", "total"):
        assert term in out
    for figure in ("gpus_per_node = 8", "bf16_flops = 989.4 TFLOP/s", "host_cpu_cores = 112"):
        assert figure in out
    assert "(GPU table H100-SXM-80GB" in out
    assert "overlap assumed: TP 50% hidden (framework megatron)" in out
    code, out, _ = invoke(*L8, "--gpu-memory", "H100", "--host-cores", "16", "--explain", "1")
    assert "host_cpu_cores = 16 (set on the command line)" in out


def test_a_size_without_a_gpu_warns_and_names_the_default() -> None:
    code, out, err = invoke(*L8, "--gpu-memory", "80GiB", "--top", "2")
    assert code == 0, err
    assert "warning: no GPU named" in out and "H100-SXM-80GB" in out


def test_closest_says_when_only_the_margin_is_missed() -> None:
    args = ["--gpu-memory", "H100", "--micro-batch", "1", "--recompute", "full", "--zero", "3",
            "--offload", "none", "--fixed-layout"]  # fmt: skip
    code, out, _ = invoke(*L8, *args, "--json")
    peak = json.loads(out)["candidates"][0]["peak_bytes"]
    gpu = 85_045_477_376  # what CUDA can allocate on an H100 (totalGlobalMem)
    margin = 1 - peak / gpu + 0.001  # just too much kept free
    code, out, _ = invoke(*L8, *args, "--margin", f"{margin:.4f}")
    assert code == 1
    assert "fits the GPU" in out and "--margin" in out and "would admit it" in out
    code, out, _ = invoke(*L8, "--gpu-memory", "8GiB", "--gpu", "h100", "--offload", "none")
    assert code == 1 and "nothing fits the GPU" in out and "over the GPU" in out
