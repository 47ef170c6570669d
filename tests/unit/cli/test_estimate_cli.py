"""``dssup estimate`` / ``dssup plan`` as a user runs them: real processes, real files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

V3 = ["--model", "deepseek-v3", "--tp", "2", "--pp", "16", "--ep", "8", "--dp", "32"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=120)


def test_json_contract() -> None:
    out = run("estimate", *V3, "--convention", "paper", "--grad-accum", "16", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["convention"] == "paper"
    assert isinstance(doc["assumptions"], list) and doc["assumptions"]
    st = doc["stages"][1]
    assert st["stage"] == 1
    assert set(st["params"]) >= {"total", "moe", "non_moe"}
    keys = {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "activations_per_micro_batch",
        "in_flight_micro_batches",
        "buffers",
        "fragmentation",
        "total",
    }
    assert keys <= set(st["bytes"])
    assert all(isinstance(st["bytes"][k], int) for k in keys)
    assert isinstance(st["host_bytes"], int)
    assert st["params"]["moe"] == 5_820_645_376
    assert doc["peak_bytes"] == max(s["bytes"]["total"] for s in doc["stages"])
    assert doc["stages"][doc["peak_stage"]]["bytes"]["total"] == doc["peak_bytes"]


def test_table_and_exit_status_for_fit() -> None:
    out = run(
        "estimate",
        *V3,
        "--gpu-memory",
        "80GiB",
        "--recompute",
        "full",
        "--zero",
        "1",
        "--global-batch-size",
        "1024",
    )
    assert out.returncode == 0, out.stderr
    assert "FITS" in out.stdout and "assumptions:" in out.stdout
    out = run("estimate", *V3, "--gpu-memory", "80GiB", "--global-batch-size", "1024")
    assert out.returncode == 1
    assert "DOES NOT FIT" in out.stdout


def test_plot_writes_png(tmp_path: Path) -> None:
    png = tmp_path / "chart.png"
    out = run("estimate", *V3, "--gpu-memory", "H100", "--grad-accum", "16", "--plot", str(png))
    assert out.returncode in (0, 1), out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_plan_prints_ranked_configs_with_exact_batch() -> None:
    out = run(
        "plan",
        "--model",
        "deepseek-v3",
        "--gpus",
        "1024",
        "--global-batch-size",
        "1024",
        "--gpu-memory",
        "80GiB",
        "--tp",
        "2",
        "--pp",
        "16",
        "--ep",
        "8",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["candidates"]
    for c in doc["candidates"]:
        t, lay = c["training"], c["layout"]
        assert t["micro_batch"] * t["grad_accum"] * lay["dp"] == 1024
        assert c["peak_bytes"] <= 0.95 * 80 * 2**30
    costs = [c["step_time_s"] for c in doc["candidates"]]
    assert costs == sorted(costs)


def test_hf_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "my-llama" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "vocab_size": 32000,
            }
        )
    )
    out = run("estimate", "--model", str(cfg.parent), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"] == "my-llama"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "nope"], "--model: 'nope' is neither a file nor a model dssup knows"),
        (
            ["--model", "deepseek-v3", "--tp", "3"],
            "--tp: 3 does not divide num_attention_heads=128",
        ),
        (
            ["--model", "deepseek-v3", "--ep", "7", "--dp", "7"],
            "--ep: 7 does not divide n_routed_experts=256",
        ),
        (
            ["--model", "deepseek-v3", "--pp", "99", "--grad-accum", "4"],
            "--pp: 99 stages for 61 layers; use at most 61",
        ),
        (
            ["--model", "deepseek-v3", "--micro-batch", "-1"],
            "--micro-batch/--micro-batch-size: -1 is out of range; use a whole number from 1",
        ),
        (["--model", "deepseek-v3", "--seq-len", "-5"], "--seq-len: "),
        (
            ["--model", "llama-3-8b", "--ep", "2", "--dp", "2"],
            "--ep: model llama-3-8b has no experts",
        ),
        (["--model", "deepseek-v3", "--gpu-memory", "lots"], "--gpu-memory: cannot read 'lots'"),
        (
            [
                "--model",
                "deepseek-v3",
                "--pp",
                "2",
                "--layers-per-stage",
                "1,2",
                "--grad-accum",
                "4",
            ],
            "--layers-per-stage: sums to 3",
        ),
        (["--model", "/nonexistent/config.json"], "does not exist"),
        (
            ["--model", "deepseek-v3", "--global-batch-size", "7", "--dp", "2"],
            "--global-batch-size: 7 is not a multiple",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    out = run("estimate", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert needle in lines[0]


def test_config_json_missing_field(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 4,
                "vocab_size": 1000,
            }
        )
    )
    # read as transformers reads it: LlamaConfig's own default (32 heads), stated
    out = run("estimate", "--model", str(cfg))
    assert out.returncode == 0, out.stderr
    assert (
        "config.json:num_attention_heads absent: 32, the default of transformers 5.23.0's "
        "llama config" in out.stdout
    )
    # a family with no config class (an approximation) has no default to take: refused
    cfg.write_text(json.dumps({"model_type": "custom_lm", "hidden_size": 1024,
                               "intermediate_size": 4096, "num_hidden_layers": 4,
                               "vocab_size": 1000}))  # fmt: skip
    out = run("estimate", "--model", str(cfg), "--approximate-as", "generic")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"dssup: error: --model: {cfg}: config.json:num_attention_heads: missing; add "
        "'num_attention_heads' to the config"
    )


def test_help_teaches() -> None:
    out = run("estimate", "--help")
    assert out.returncode == 0
    for flag in (
        "--tp",
        "--pp",
        "--ep",
        "--etp",
        "--dp",
        "--cp",
        "--sp / --no-sp",
        "--layers-per-stage",
        "--zero",
        "--offload",
        "--micro-batch",
        "--seq-len",
        "--grad-accum",
        "--recompute",
        "--flash-attn / --no-flash-attn",
        "--convention",
        "--gpu-memory",
        "--json",
        "--plot",
        "Examples:",
    ):
        assert flag in out.stdout, flag


def test_dtypes_flag_changes_bytes_per_parameter() -> None:
    base = ["estimate", "--model", "llama-3-8b", "--json"]
    ref = json.loads(run(*base).stdout)["stages"][0]
    out = run(*base, "--dtypes", "weights=fp32,grads=bf16,master=none,moments=bf16")
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)["stages"][0]
    p = st["params"]["total"]
    assert (st["bytes"]["weights"], st["bytes"]["gradients"], st["bytes"]["optimizer"]) == (
        4 * p,
        2 * p,
        4 * p,
    )
    assert ref["bytes"]["optimizer"] == 12 * p
    bad = run(*base, "--dtypes", "weights=int3")
    assert bad.returncode == 2 and "--dtypes: cannot read 'weights=int3'" in bad.stderr


def test_calibration_file_switches_to_the_eager_profile(tmp_path: Path) -> None:
    from dssup.memory.profile import EagerProfile, LayerCoefficients, LevelBytes

    lv = LevelBytes(none=3_000_000_000, selective=2_000_000_000, full=100_000_000)
    prof = EagerProfile(
        source="test profile",
        seq_len=4096,
        dtype="bf16",
        optimizer="foreach",
        dense=LayerCoefficients(per_sample=lv, constant=LevelBytes(none=0, selective=0, full=0)),
        stage=LayerCoefficients(per_sample=lv, constant=LevelBytes(none=0, selective=0, full=0)),
        optimizer_transient_per_param=4.0,
    )
    cal = tmp_path / "cal.json"
    cal.write_text(prof.model_dump_json())
    base = ["estimate", "--model", "llama-3-8b", "--json"]
    plain = json.loads(run(*base).stdout)
    eager = run(*base, "--calibration", str(cal))
    assert eager.returncode == 0, eager.stderr
    doc = json.loads(eager.stdout)
    assert doc["assumptions"][0].startswith("eager implementation profile (test profile")
    assert doc["peak_bytes"] != plain["peak_bytes"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = run(*base, "--calibration", str(bad))
    assert out.returncode == 2
    assert "--calibration:" in out.stderr and "dssup calibrate" in out.stderr


def test_json_echoes_the_inputs() -> None:
    out = run("estimate", *V3, "--zero", "1", "--global-batch-size", "1024", "--recompute",
              "selective", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    i = json.loads(out.stdout)["inputs"]
    assert i["parameters"] == 671_026_419_200  # DeepSeek-V3 without its MTP module
    assert (i["layout"]["tp"], i["layout"]["pp"], i["layout"]["ep"], i["layout"]["dp"]) == (
        2, 16, 8, 32,
    )  # fmt: skip
    assert sum(i["layout"]["layers_per_stage"]) == 61  # the split the estimate chose
    assert (i["micro_batch"], i["grad_accum"], i["global_batch"]) == (1, 32, 1024)
    assert (i["seq_len"], i["recompute"], i["zero_stage"], i["offload"]) == (
        4096, "selective", 1, "none",
    )  # fmt: skip
    assert i["bytes_per_parameter"]["weights"] == 2 and i["calibrated"] is False


def test_plot_names_the_layout_and_the_verdict(tmp_path: Path) -> None:
    from dssup.cli.plot import _layout, _verdict
    from dssup.memory import Estimate

    out = run("estimate", *V3, "--global-batch-size", "1024", "--gpu-memory", "H100",
              "--plot", str(tmp_path / "v3.png"))  # fmt: skip
    assert out.returncode == 1 and (tmp_path / "v3.png").stat().st_size > 10_000
    doc = json.loads(run("estimate", *V3, "--global-batch-size", "1024", "--gpu-memory", "H100",
                         "--json").stdout)  # fmt: skip
    est = Estimate.model_validate(doc)
    assert _layout(est).startswith("deepseek-v3 (convention megatron): TP 2, PP 16, EP 8, DP 32")
    assert "micro-batch 1 x accum 32 (global 1024)" in _layout(est)
    assert "DOES NOT FIT the GPU's 79.2 GiB" in _verdict(est)
