"""The load-path table (what loads natively, what needs a conversion, what only the fallback
can do), checked against the behaviour measured with DeepSpeed 0.19.8."""

from __future__ import annotations

from pathlib import Path

import pytest

from dssup.supervisor.deepspeed.ckpt_info import CheckpointInfo
from dssup.supervisor.deepspeed.compat import decide_load


def info(stage: int, dp: int, **kw: object) -> CheckpointInfo:
    base = {
        "path": Path("/ck/global_step4"),
        "tag": "global_step4",
        "zero_stage": stage,
        "dp_world_size": dp,
        "global_steps": 4,
        "global_samples": 32,
        "complete": True,
    }
    return CheckpointInfo.model_validate(base | kw)


@pytest.mark.parametrize(
    ("src", "dst", "kind"),
    [
        ((1, 2), (1, 2), "direct"),  # same stage, same DP (micro-batch may differ)
        ((3, 2), (3, 2), "direct"),
        ((1, 2), (2, 2), "direct"),  # 1 <-> 2 share a layout
        ((2, 2), (1, 2), "direct"),
        ((0, 2), (0, 1), "direct"),  # stage 0: every rank holds everything
        ((0, 1), (0, 2), "direct"),
        ((1, 2), (3, 2), "universal"),
        ((2, 2), (3, 2), "universal"),
        ((3, 2), (1, 2), "universal"),
        ((0, 2), (2, 2), "universal"),
        ((1, 2), (1, 1), "universal"),  # DP change at stages 1-3
        ((2, 1), (2, 2), "universal"),
        ((3, 4), (3, 2), "universal"),
        ((1, 2), (0, 2), "fp32-fallback"),  # nothing loads ZeRO state into stage 0
        ((3, 2), (0, 1), "fp32-fallback"),
    ],
)
def test_table(src: tuple[int, int], dst: tuple[int, int], kind: str) -> None:
    path = decide_load(info(*src), *dst)
    assert path.kind == kind, path.reason
    assert path.keeps_optimizer == (kind != "fp32-fallback")
    assert f"ZeRO-{src[0]}" in path.reason and f"ZeRO-{dst[0]}" in path.reason


def test_partial_missing_and_universal_sources() -> None:
    partial = info(1, 2, complete=False, missing=("zero_pp_rank_1_mp_rank_00_optim_states.pt",))
    assert decide_load(partial, 1, 2).kind == "none"
    assert "partial" in decide_load(partial, 1, 2).reason
    assert decide_load(None, 1, 2).kind == "none"
    uni = info(1, 2, universal=True)
    assert decide_load(uni, 3, 4).kind == "universal"
    assert decide_load(uni, 0, 2).kind == "fp32-fallback"
    assert "FRESH optimizer" in decide_load(uni, 0, 2).reason
