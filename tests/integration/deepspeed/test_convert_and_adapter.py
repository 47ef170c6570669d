"""Conversion and the adapter on real DeepSpeed checkpoints (fixtures), each conversion a real
``ucp_worker`` child with DeepSpeed 0.19.8: cached once, source untouched, the loud fp32
fallback, a broken checkpoint; the adapter's JSON, flag and environment for each attempt."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import zipfile
from pathlib import Path

import pytest
from ds_launch import needs_deepspeed

from dssup.supervisor.command import parse_command
from dssup.supervisor.deepspeed import DeepSpeedAdapter, prepare_resume, read_checkpoint
from dssup.supervisor.models import TrainingPlan

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, needs_deepspeed]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed"


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "zero1-dp2", dst)
    return dst


def test_universal_conversion_is_cached_and_leaves_the_source_alone(
    ckpt: Path, tmp_path: Path
) -> None:
    before = digest(ckpt)
    info = read_checkpoint(ckpt)
    first = prepare_resume(info, 3, 2, tmp_path / "cache")
    assert (first.kind, first.load_universal, first.cached, first.keeps_optimizer) == (
        "universal",
        True,
        False,
        True,
    )
    assert first.seconds > 0 and first.load_dir is not None
    tag = first.load_dir / "global_step2"
    assert (first.load_dir / "latest_universal").read_text() == "global_step2"
    assert (tag / "mp_rank_00_model_states.pt").is_file()
    assert (tag / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file()  # adjustment 1
    for param in ("inp.weight", "blocks.0.fc.bias", "out.weight"):
        assert {p.name for p in (tag / "zero" / param).iterdir()} == {
            "fp32.pt",
            "exp_avg.pt",
            "exp_avg_sq.pt",
            "step.pt",
        }
    again = prepare_resume(read_checkpoint(ckpt), 3, 2, tmp_path / "cache")
    assert (again.cached, again.seconds, again.load_dir) == (True, 0.0, first.load_dir)
    assert digest(ckpt) == before
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_moving_down_to_stage_0_falls_back_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    info = read_checkpoint(FIXTURES / "zero3-dp2")
    with caplog.at_level(logging.WARNING):
        r = prepare_resume(info, 0, 1, tmp_path / "cache")
    assert (r.kind, r.keeps_optimizer, r.load_universal) == ("fp32-fallback", False, False)
    assert "OPTIMIZER STATE LOST" in r.warning and "FRESH optimizer" in r.reason
    assert r.fp32_weights is not None and r.fp32_weights.stat().st_size > 0
    assert (r.global_steps, r.global_samples) == (2, 8)
    assert any("OPTIMIZER STATE LOST" in rec.getMessage() for rec in caplog.records)


def test_unreadable_or_unconvertible_checkpoint_means_no_resume(ckpt: Path, tmp_path: Path) -> None:
    optim = sorted((ckpt / "global_step2").glob("*optim_states.pt"))
    # 1. the tensors are gone but the object tree reads: inspection passes, conversion and
    # the fp32 export fail for real in the child, so the next attempt starts fresh.
    for path in optim:
        with zipfile.ZipFile(path) as zf:
            entries = {n: zf.read(n) for n in zf.namelist() if "/data/" not in n}
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in entries.items():
                zf.writestr(name, data)
    info = read_checkpoint(ckpt)
    assert info is not None and info.complete
    r = prepare_resume(info, 3, 2, tmp_path / "cache")
    assert r.kind == "none" and "conversion failed" in r.reason and "fp32 export failed" in r.reason
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]
    # 2. a truncated file: reported as unreadable, never converted
    optim[0].write_bytes(b"truncated")
    info = read_checkpoint(ckpt)
    assert info is not None and not info.complete and "unreadable" in info.missing[-1]
    assert prepare_resume(info, 3, 2, tmp_path / "cache").kind == "none"


def test_adapter_steers_each_attempt(ckpt: Path, tmp_path: Path) -> None:
    user_json = tmp_path / "ds.json"
    user = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000},
        "steps_per_print": 7,
    }
    user_json.write_text(json.dumps(user))
    cmd = parse_command(
        [
            "torchrun",
            "--nproc-per-node",
            "2",
            "train.py",
            "--deepspeed_config",
            str(user_json),
            "--save-dir",
            str(ckpt),
        ],
        env={},
    )
    ad = DeepSpeedAdapter()
    assert (ad.capabilities, ad.remedy_steps()) == (frozenset(), [])  # inert until it sees a JSON
    plan = ad.initial_plan(cmd, TrainingPlan())
    assert ad.capabilities == {"zero_stage", "offload", "recompute"} and ad.remedy_steps()
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch, plan.dp, plan.zero_stage) == (
        1,
        2,
        4,
        2,
        1,
    )
    assert ad.checkpoint_dirs(cmd) == [ckpt]

    run = tmp_path / "run"
    a2 = run / "attempt-002"
    a2.mkdir(parents=True)
    applied = ad.apply(plan.model_copy(update={"zero_stage": 3}), cmd, list(cmd.script_args), a2)
    written = json.loads((a2 / "ds_config.json").read_text())
    assert written["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1000}
    assert written["checkpoint"] == {"load_universal": True} and written["steps_per_print"] == 7
    assert applied.script_args is not None
    assert applied.script_args[applied.script_args.index("--deepspeed_config") + 1] == str(
        a2 / "ds_config.json"
    )
    assert json.loads(user_json.read_text()) == user  # the user's JSON is only read
    resume_dir = Path(applied.env["DSSUP_RESUME_FROM"])
    assert resume_dir.name == "global_step2" and (run / "deepspeed-ucp") in resume_dir.parents
    assert applied.env["DSSUP_DS_RESUME_KIND"] == "universal"
    changes = json.loads((a2 / "ds_config.changes.json").read_text())["changes"]
    assert {c["key"] for c in changes} >= {"zero_optimization.stage", "checkpoint.load_universal"}
    assert any("zero_optimization.stage: 1 -> 3" in n for n in applied.notes)

    # attempt 2 saved natively at stage 3: attempt 3 loads directly, load_universal off again
    shutil.copytree(FIXTURES / "zero3-dp2" / "global_step2", ckpt / "global_step4")
    (ckpt / "latest").write_text("global_step4")
    a3 = run / "attempt-003"
    a3.mkdir()
    applied3 = ad.apply(plan.model_copy(update={"zero_stage": 3}), cmd, list(cmd.script_args), a3)
    assert applied3.env["DSSUP_DS_RESUME_KIND"] == "direct"
    assert applied3.env["DSSUP_RESUME_FROM"] == str(ckpt / "global_step4")
    assert json.loads((a3 / "ds_config.json").read_text()).get("checkpoint") is None
