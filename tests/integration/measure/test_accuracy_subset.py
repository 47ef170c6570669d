"""Regression subset of docs/accuracy.md, recomputed on every CI run (about two minutes on 2
cores).

One calibration (FakeTensorMode traces of one and two layers) and real CPU measurements (each
cross-checked against torch.profiler inside ``measure``) covering an optimizer-step peak,
backward peaks, the end of backward (full recompute with the optimizer offloaded: the eager
profile's end-of-backward term), and the savings of every remedy kind: micro-batch halved,
recompute up one level, ZeRO up one stage and optimizer offload. The ZeRO rows are rank 0 of a two-rank job on torch's
fake process group and offload puts the optimizer on the meta device: neither a second rank nor
a host/accelerator pair exists on a CPU-only CI machine (``dssup.runtime.reference.zero``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: bench/

from bench.accuracy import Calibrations, evaluate, remedies
from bench.accuracy_configs import CI_SUBSET, CONFIGS

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]


def test_subset_within_target_and_phase_right() -> None:
    cals = Calibrations()
    rows = [evaluate(c, cals) for c in CONFIGS if c.id in CI_SUBSET]
    assert [r.id for r in rows] == CI_SUBSET
    for r in rows:
        assert -0.02 <= r.error <= 0.04, (r.id, r.error)
        assert (r.phase == "optimizer") == (r.predicted_phase == "optimizer-step"), r
    phases = {r.phase for r in rows}
    assert phases == {"optimizer", "backward"}  # both regimes are exercised
    tail = next(r for r in rows if r.id == "dense-gqa/fp32/foreach/b1/full/dp2-z1/offload")
    assert tail.predicted_phase == "forward-backward", tail  # the end of backward, not the step
    rem = remedies(rows)
    assert rem, "the subset must contain a remedy pair"
    assert all(x["ok"] for x in rem), rem
    kinds = {str(x["remedy"]).split(" ")[0] for x in rem}
    assert kinds == {"micro-batch", "recompute", "ZeRO", "optimizer"}, kinds
    zero = {str(x["remedy"]) for x in rem if str(x["remedy"]).startswith("ZeRO")}
    assert zero == {"ZeRO 0 -> 1 (dp 2)", "ZeRO 1 -> 2 (dp 2)"}, zero
