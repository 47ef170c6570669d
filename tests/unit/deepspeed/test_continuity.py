"""Loss continuity after a resume: re-done steps, the trend band, and the sample counter."""

from __future__ import annotations

import math

from dssup.supervisor.deepspeed.continuity import LossPoint, check_continuity, parse_loss_lines

GB = 8


def pts(losses: dict[int, float], samples: bool = True) -> list[LossPoint]:
    return [
        LossPoint(step=s, loss=v, global_samples=s * GB if samples else None)
        for s, v in losses.items()
    ]


BEFORE = pts({1: 2.0, 2: 1.8, 3: 1.6, 4: 1.5, 5: 1.4, 6: 1.3})  # failed after step 6


def test_redone_steps_match_and_trend_continues() -> None:
    after = pts({5: 1.4000001, 6: 1.2999999, 7: 1.2, 8: 1.1})  # resumed from step 4
    r = check_continuity(BEFORE, after, 4, checkpoint_samples=32, global_batch=GB)
    assert r.ok and r.verdict == "continuous", r.detail
    assert r.redo_steps == 2 and r.redo_max_rel_diff is not None and r.redo_max_rel_diff < 1e-6
    assert r.expected is not None and r.observed is not None and r.band is not None


def test_redone_step_that_differs_is_a_failed_recovery() -> None:
    after = pts({5: 1.9, 6: 1.8, 7: 1.7})  # e.g. the optimizer state was lost
    r = check_continuity(BEFORE, after, 4)
    assert not r.ok and r.verdict == "jump" and "re-done" in r.detail


def test_jump_on_new_steps_is_a_failed_recovery() -> None:
    r = check_continuity(BEFORE[:4], pts({5: 3.0, 6: 2.9, 7: 2.8}), 4)
    assert not r.ok and r.verdict == "jump" and "LOSS JUMP" in r.detail
    ok = check_continuity(BEFORE[:4], pts({5: 1.45, 6: 1.32, 7: 1.21}), 4)
    assert ok.ok, ok.detail


def test_samples_must_advance_without_gap_or_repeat() -> None:
    repeat = [LossPoint(step=5, loss=1.4, global_samples=32)]  # step 5 should end at 40
    r = check_continuity(BEFORE, repeat, 4, checkpoint_samples=32, global_batch=GB)
    assert (r.ok, r.verdict, r.samples_expected, r.samples_observed) == (
        False,
        "sample-gap",
        40,
        32,
    )


def test_nan_and_too_little_data() -> None:
    assert not check_continuity(BEFORE, [LossPoint(step=5, loss=math.nan)], 4).ok
    r = check_continuity(BEFORE[:1], pts({2: 1.8}, samples=False)[:0], 1)
    assert r.verdict == "insufficient-data" and not r.ok


def test_parse_loss_lines_reads_json_and_text() -> None:
    text = "\n".join(
        [
            'DSSUP_DS {"event": "engine", "zero_stage": 1}',
            'DSSUP_DS {"event": "step", "step": 3, "loss": 0.8179729953408241, "global_samples": 24}',
            "[rank0] step 4 | loss 0.75 | lr 1e-3",
            "unrelated line",
        ]
    )
    got = parse_loss_lines(text)
    assert got == [
        LossPoint(step=3, loss=0.8179729953408241, global_samples=24),
        LossPoint(step=4, loss=0.75),
    ]
