"""Cutting a rank's share into micro-batches: order kept, every structure, the next split."""

from __future__ import annotations

import pytest
import torch

from dssup.errors import ConfigError
from dssup.runtime.microbatch import finer_split, sample_count, spans, take
from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.remedies import HalveMicroBatchStep


@pytest.mark.parametrize(
    ("mb", "share", "floor", "expected"),
    [
        (16, 16, 1, 8),
        (8, 16, 1, 4),
        (1, 16, 1, None),
        (12, 12, 1, 6),
        (6, 12, 1, 3),
        (3, 12, 1, 1),  # 3 // 2 = 1
        (16, 24, 1, 8),
        (5, 15, 1, 1),  # the largest divisor of 15 at most 2 is 1
        (16, 16, 8, 8),
        (8, 16, 8, None),  # floor reached
    ],
)
def test_finer_split_is_the_largest_divisor_at_most_half(mb, share, floor, expected):
    assert finer_split(mb, share, floor) == expected


@pytest.mark.parametrize("mb", [16, 12, 8, 6, 5, 3, 2])
def test_finer_split_agrees_with_the_supervisors_halving_rung(mb):
    """The job and the supervisor walk the same ladder, so a restart continues it."""
    share = 48 if 48 % mb == 0 else mb * 3
    plan = TrainingPlan(micro_batch=mb, grad_accum=share // mb, global_batch=share * 2, dp=2)
    failure = Failure(kind=FailureKind.CUDA_OOM)
    remedy = HalveMicroBatchStep().propose(
        failure, plan, RemedyContext(frozenset(), frozenset(), "cuda")
    )
    expected = remedy.plan.micro_batch if remedy else None
    assert finer_split(mb, share) == expected


def test_spans_cover_the_share_in_order():
    assert spans(16, 4) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    with pytest.raises(ConfigError, match="micro_batch"):
        spans(16, 5)


def test_take_keeps_structure_and_order():
    x = torch.arange(16).reshape(8, 2)
    assert take(x, 2, 4).tolist() == [[4, 5], [6, 7]]
    pair = take((x, x + 100), 6, 8)
    assert isinstance(pair, tuple) and pair[1][0].tolist() == [112, 113]
    batch = {"input_ids": x, "labels": x * 2, "meta": "kept"}
    part = take(batch, 0, 1)
    assert part["meta"] == "kept" and part["labels"].tolist() == [[0, 2]]
    assert take(list("abcdefgh"), 3, 5) == ["d", "e"]
    assert take(x, 0, 8).data_ptr() == x.data_ptr(), "a view, not a copy"


def test_sample_count_refuses_what_it_cannot_split():
    assert sample_count({"a": torch.zeros(4, 3), "b": torch.zeros(4)}) == 4
    assert sample_count(["s1", "s2", "s3"]) == 3
    with pytest.raises(ConfigError, match="different leading sizes"):
        sample_count({"a": torch.zeros(4), "b": torch.zeros(5)})
    with pytest.raises(ConfigError, match="cannot split a int"):
        sample_count(7)
