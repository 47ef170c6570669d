"""Locks the public API: removing or renaming a name here is a breaking change."""

from __future__ import annotations

import dssup
import dssup.errors
import dssup.memory


def test_top_level_api() -> None:
    assert sorted(dssup.__all__) == sorted(
        [
            "ConfigError",
            "DssupError",
            "Estimate",
            "EstimateError",
            "JournalError",
            "LaunchError",
            "Layout",
            "MalformedReview",
            "ModelSpec",
            "NoFeasiblePlan",
            "Overheads",
            "PlanRequest",
            "PlanResult",
            "Precision",
            "RetriesExhausted",
            "Training",
            "UnknownPreset",
            "__version__",
            "estimate",
            "plan",
            "preset",
        ]
    )
    for name in dssup.__all__:
        assert hasattr(dssup, name), name


def test_memory_api() -> None:
    assert sorted(dssup.memory.__all__) == sorted(
        [
            "Candidate",
            "Estimate",
            "GiB",
            "Layout",
            "MLASpec",
            "MoESpec",
            "ModelSpec",
            "Overheads",
            "ParamCounts",
            "PlanRequest",
            "PlanResult",
            "Precision",
            "StageBytes",
            "StageEstimate",
            "Training",
            "estimate",
            "known_model_types",
            "model_from_hf_config",
            "plan",
            "preset",
            "preset_names",
        ]
    )


def test_error_tree() -> None:
    for name in dssup.errors.__all__:
        cls = getattr(dssup.errors, name)
        assert issubclass(cls, dssup.errors.DssupError), name
    err = dssup.errors.ConfigError("tp", "3 does not divide 128", "use 2")
    assert str(err) == "tp: 3 does not divide 128; use 2"
    assert isinstance(err, ValueError)
