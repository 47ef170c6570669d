"""The DeepSpeed JSON: finding it in a command, DeepSpeed's batch rules, the derived plan."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dssup.errors import ConfigError
from dssup.supervisor.deepspeed.config import (
    derive_plan,
    find_config,
    load_config_value,
    resolve_batch,
)


@pytest.mark.parametrize(
    ("args", "flag", "index", "inline"),
    [
        (["--deepspeed_config", "ds.json", "--x"], "--deepspeed_config", 0, False),
        (["--lr", "1", "--deepspeed", "ds.json"], "--deepspeed", 2, False),
        (["--ds-config=ds.json"], "--ds-config", 0, True),
        (["--deepspeed-config", "ds.json"], "--deepspeed-config", 0, False),
        (["--ds_config", "ds.json"], "--ds_config", 0, False),
    ],
)
def test_find_config_spellings(args: list[str], flag: str, index: int, inline: bool) -> None:
    src = find_config(args)
    assert src is not None
    assert (src.flag, src.index, src.inline, src.value) == (flag, index, inline, "ds.json")


def test_bare_deepspeed_switch_is_not_a_config() -> None:
    assert find_config(["--deepspeed", "--deepspeed_config_file_missing"]) is None
    assert find_config(["--lr", "3"]) is None


def test_load_from_file_and_base64(tmp_path: Path) -> None:
    cfg = {"train_batch_size": 8, "zero_optimization": {"stage": 2}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    assert load_config_value(str(path)) == cfg
    b64 = base64.urlsafe_b64encode(json.dumps(cfg).encode()).decode()
    assert load_config_value(b64) == cfg


def test_load_rejects_garbage(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a file nor base64"):
        load_config_value("not/a/file.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config_value(str(bad))


@pytest.mark.parametrize(
    ("tb", "mb", "gas", "dp", "want"),
    [
        (32, 4, None, 2, (32, 4, 4)),  # TB and MB: GAS derived
        (32, None, 4, 2, (32, 4, 4)),  # TB and GAS: MB derived
        (None, 4, 4, 2, (32, 4, 4)),  # MB and GAS: TB derived
        (32, None, None, 2, (32, 16, 1)),  # TB only
        (None, 4, None, 2, (8, 4, 1)),  # MB only
        (32, 4, 4, 2, (32, 4, 4)),  # all three, consistent
    ],
)
def test_resolve_batch_follows_deepspeed(
    tb: int | None, mb: int | None, gas: int | None, dp: int, want: tuple[int, int, int]
) -> None:
    assert resolve_batch(tb, mb, gas, dp) == want


@pytest.mark.parametrize(
    ("tb", "mb", "gas", "dp"), [(30, 4, 4, 2), (32, 5, None, 2), (None, None, 2, 2)]
)
def test_resolve_batch_rejects_what_deepspeed_asserts(
    tb: int | None, mb: int | None, gas: int | None, dp: int
) -> None:
    with pytest.raises(ConfigError):
        resolve_batch(tb, mb, gas, dp)


def test_derive_plan_reads_every_knob() -> None:
    raw = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "nvme", "nvme_path": "/x"},
        },
        "activation_checkpointing": {"partition_activations": True},
        "bf16": {"enabled": True},
        "checkpoint": {"load_universal": True},
        "optimizer": {"type": "AdamW"},  # not read, must not disturb
    }
    p = derive_plan(raw, dp=4)
    assert (p.train_batch_size, p.micro_batch, p.grad_accum, p.dp) == (64, 2, 8, 4)
    assert (p.zero_stage, p.offload_optimizer, p.offload_param) == (3, "cpu", "nvme")
    assert p.activation_checkpointing and p.bf16 and not p.fp16 and p.load_universal


def test_derive_plan_defaults_and_errors() -> None:
    p = derive_plan({"train_micro_batch_size_per_gpu": 1}, dp=2)
    assert (p.zero_stage, p.offload_optimizer, p.activation_checkpointing) == (0, "none", False)
    with pytest.raises(ConfigError, match="auto"):
        derive_plan({"train_batch_size": "auto"}, dp=2)
    with pytest.raises(ConfigError, match=r"zero_optimization\.stage"):
        derive_plan({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, dp=2)


def test_adapter_stays_out_of_jobs_without_a_deepspeed_json(tmp_path: Path) -> None:
    from dssup.supervisor.command import parse_command
    from dssup.supervisor.deepspeed import DeepSpeedAdapter
    from dssup.supervisor.models import TrainingPlan

    cmd = parse_command(
        ["torchrun", "--nproc-per-node", "2", "train.py", "--output_dir", "out", "--lr", "1"],
        env={},
    )
    ad = DeepSpeedAdapter()
    assert not ad.applies(cmd)
    assert ad.applies(parse_command(["torchrun", "t.py", "--deepspeed", "ds.json"], env={}))
    plan = TrainingPlan(micro_batch=4, grad_accum=2, global_batch=16, dp=2)
    assert ad.initial_plan(cmd, plan) == plan
    assert (ad.capabilities, list(ad.remedy_steps()), ad.checkpoint_dirs(cmd)) == (
        frozenset(),
        [],
        [],
    )
    applied = ad.apply(plan, cmd, list(cmd.script_args), tmp_path / "attempt-001")
    assert (applied.script_args, applied.env, applied.notes) == (None, {}, [])
    assert not (tmp_path / "attempt-001").exists()


HF_AUTO = Path(__file__).parents[2] / "fixtures" / "deepspeed" / "hf" / "ds_config_zero2.json"


def test_hf_auto_batch_values_are_filled_as_hf_does(tmp_path: Path) -> None:
    """train_micro_batch_size_per_gpu = per-device batch, gradient_accumulation_steps = the
    accumulation, train_batch_size = world x both (HF's trainer_config_process)."""
    import json

    from dssup.supervisor.command import parse_command
    from dssup.supervisor.deepspeed import DeepSpeedAdapter
    from dssup.supervisor.deepspeed.config import fill_auto
    from dssup.supervisor.models import TrainingPlan

    raw = json.loads(HF_AUTO.read_text())
    filled = fill_auto(raw, dp=2, auto={"micro_batch": 16, "grad_accum": 2})
    keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    assert [filled[k] for k in keys] == [16, 2, 64]
    assert filled["optimizer"] == raw["optimizer"]  # the rest is HF's to fill, left alone
    with pytest.raises(ConfigError, match="HF Trainer") as err:
        fill_auto(raw, dp=2, auto={"micro_batch": None, "grad_accum": None})
    assert "--per_device_train_batch_size" in str(err.value)
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", "run_clm.py", "--deepspeed",
                         str(HF_AUTO), "--per_device_train_batch_size", "16"], env={})  # fmt: skip
    ad = DeepSpeedAdapter()
    plan = ad.initial_plan(cmd, TrainingPlan(micro_batch=16, grad_accum=1, dp=2, world_size=2))
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch, plan.zero_stage) == (16, 1, 32, 2)
    assert plan.offload == "optimizer"
    applied = ad.apply(plan.model_copy(update={"micro_batch": 8, "grad_accum": 2}), cmd,
                       list(cmd.script_args), tmp_path / "attempt-002")  # fmt: skip
    written = json.loads((tmp_path / "attempt-002" / "ds_config.json").read_text())
    assert [written[k] for k in keys] == [8, 2, 32]
    assert applied.script_args is not None and str(tmp_path) in applied.script_args[1]


@pytest.mark.deepspeed
def test_the_engines_own_configuration_dump_is_read_back(monkeypatch) -> None:
    """DeepSpeedConfig.print itself (at INFO), parsed into the job-side report's record."""
    import io
    import logging

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    config_mod = pytest.importorskip("deepspeed.runtime.config")
    from deepspeed.utils import logger

    from dssup.supervisor.deepspeed import DeepSpeedAdapter

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        cfg = config_mod.DeepSpeedConfig({"train_batch_size": 8,
                                          "train_micro_batch_size_per_gpu": 2,
                                          "gradient_accumulation_steps": 4})  # fmt: skip
        cfg.print("DeepSpeedEngine configuration")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    (rec,) = DeepSpeedAdapter().reported(buf.getvalue())
    assert (rec.micro_batch, rec.grad_accum, rec.dp, rec.global_batch) == (2, 4, 1, 8)
    assert rec.source == "deepspeed-engine-log"
