"""Writing the next attempt's JSON: only dssup's keys change, the batch stays exact, atomic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dssup.errors import ConfigError
from dssup.supervisor.deepspeed.config import derive_plan
from dssup.supervisor.deepspeed.render import render_config, write_json_atomic

USER: dict[str, Any] = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8, "overlap_comm": True},
    "bf16": {"enabled": True},
    "gradient_clipping": 1.0,
    "wall_clock_breakdown": False,
}


def test_user_keys_survive_and_changes_are_explained() -> None:
    user = derive_plan(USER, dp=2)
    plan = user.model_copy(
        update={
            "micro_batch": 2,
            "grad_accum": 8,
            "zero_stage": 3,
            "offload_optimizer": "cpu",
            "activation_checkpointing": True,
        }
    )
    new, changes = render_config(USER, plan)
    assert new["optimizer"] == USER["optimizer"]
    assert new["zero_optimization"]["reduce_bucket_size"] == 5e8
    assert new["zero_optimization"]["overlap_comm"] is True
    assert (new["bf16"], new["gradient_clipping"]) == (USER["bf16"], 1.0)
    assert list(new)[: len(USER)] == list(USER)  # the user's key order is kept
    keys = {c.key: (c.before, c.after) for c in changes}
    assert keys == {
        "train_micro_batch_size_per_gpu": (4, 2),
        "gradient_accumulation_steps": (None, 8),
        "zero_optimization.stage": (1, 3),
        "zero_optimization.offload_optimizer.device": (None, "cpu"),
        "activation_checkpointing.number_checkpoints": (None, 1),
    }  # USER has an optimizer section: DeepSpeed builds its CPU Adam, nothing else to allow
    assert all(c.why for c in changes)
    assert USER["zero_optimization"]["stage"] == 1  # the input is not mutated


def test_same_plan_changes_nothing_but_spells_out_the_triple() -> None:
    new, changes = render_config(USER, derive_plan(USER, dp=2))
    assert [c.key for c in changes] == ["gradient_accumulation_steps"]
    again, more = render_config(new, derive_plan(new, dp=2))
    assert again == new and more == []


def test_turning_things_off_and_load_universal() -> None:
    raw = {
        **USER,
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
    }
    plan = derive_plan(raw, dp=2).model_copy(
        update={"offload_optimizer": "none", "load_universal": True}
    )
    new, _ = render_config(raw, plan)
    assert new["zero_optimization"]["offload_optimizer"] == {"device": "none", "pin_memory": True}
    assert new["checkpoint"] == {"load_universal": True}
    back, changes = render_config(new, plan.model_copy(update={"load_universal": False}))
    assert back["checkpoint"] == {"load_universal": False}
    assert [c.key for c in changes] == ["checkpoint.load_universal"]


def test_broken_invariant_or_impossible_offload_is_refused() -> None:
    plan = derive_plan(USER, dp=2)
    with pytest.raises(ConfigError, match="global batch"):
        render_config(USER, plan.model_copy(update={"micro_batch": 3}))
    with pytest.raises(ConfigError, match="stage 3"):
        render_config(USER, plan.model_copy(update={"offload_param": "cpu"}))
    with pytest.raises(ConfigError, match="stage 1-3"):
        render_config(USER, plan.model_copy(update={"zero_stage": 0, "offload_optimizer": "cpu"}))


@given(
    mb=st.integers(1, 16),
    gas=st.integers(1, 16),
    dp=st.integers(1, 64),
    stage=st.integers(0, 3),
    new_mb_div=st.integers(1, 4),
)
def test_rendered_triple_always_multiplies_out(
    mb: int, gas: int, dp: int, stage: int, new_mb_div: int
) -> None:
    raw = {
        "train_batch_size": mb * gas * dp,
        "train_micro_batch_size_per_gpu": mb,
        "zero_optimization": {"stage": stage},
    }
    plan = derive_plan(raw, dp)
    share = mb * gas
    new_mb = (
        max(d for d in range(1, mb // new_mb_div + 1) if share % d == 0) if mb >= new_mb_div else 1
    )
    new, _ = render_config(
        raw, plan.model_copy(update={"micro_batch": new_mb, "grad_accum": share // new_mb})
    )
    assert (
        new["train_micro_batch_size_per_gpu"] * new["gradient_accumulation_steps"] * dp
        == new["train_batch_size"]
        == raw["train_batch_size"]
    )
    assert derive_plan(new, dp).train_batch_size == raw["train_batch_size"]


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "attempt-002" / "ds_config.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in target.parent.iterdir()] == ["ds_config.json"]


def test_offload_with_the_scripts_own_optimizer_is_allowed_explicitly() -> None:
    raw = {k: v for k, v in USER.items() if k != "optimizer"}
    plan = derive_plan(raw, dp=2).model_copy(update={"offload_optimizer": "cpu"})
    new, changes = render_config(raw, plan)
    assert new["zero_force_ds_cpu_optimizer"] is False
    assert "zero_force_ds_cpu_optimizer" in {c.key for c in changes}
    user_set = {**raw, "zero_force_ds_cpu_optimizer": True}  # the user's choice stands
    assert render_config(user_set, plan)[0]["zero_force_ds_cpu_optimizer"] is True
