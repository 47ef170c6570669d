"""``--convention paper`` stays byte-identical to what it was before per-device accounting.

The fixtures (tests/fixtures/memory/README.md) were written by main at a0d6851: every
field the JSON contract had then must come out the same (new fields may be added), and the CLI's
text output must be the same to the byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dssup.cli import main
from dssup.memory import Layout, Training, estimate, preset

FIXTURES = Path(__file__).parents[2] / "fixtures" / "memory"
GOLDEN = json.loads((FIXTURES / "paper_golden.json").read_text(encoding="utf-8"))
CLI = json.loads((FIXTURES / "paper_cli" / "cases.json").read_text(encoding="utf-8"))

_STAGE_KEYS = ("stage", "layers", "params", "bytes", "host_bytes", "phase", "activation_terms")
_BYTES_KEYS = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "activations_per_micro_batch",
    "in_flight_micro_batches",
    "in_flight_factor",
    "zero3_working_set",
    "buffers",
    "optimizer_transient",
    "calibration",
    "fragmentation",
    "cuda_context",
    "total",
)
_REST_KEYS = (
    "convention",
    "model",
    "world_size",
    "peak_stage",
    "peak_bytes",
    "peak_phase",
    "gpu_memory_bytes",
    "fits",
    "headroom_bytes",
    "assumptions",
)


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _old_fields(stage: dict[str, Any]) -> dict[str, Any]:
    out = {k: stage[k] for k in _STAGE_KEYS}
    out["bytes"] = {k: stage["bytes"][k] for k in _BYTES_KEYS}
    out["params"] = {k: stage["params"][k] for k in ("total", "moe", "non_moe")}
    return out


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['model']}-{len(c['stages'])}st")
def test_paper_estimate_is_byte_identical(case: dict[str, Any]) -> None:
    est = estimate(
        preset(case["model"]),
        Layout.model_validate(case["layout"]),
        Training.model_validate(case["training"]),
        convention="paper",
        gpu_memory_bytes=80 << 30,
    ).model_dump(mode="json")
    assert est["peak_bytes"] == case["peak_bytes"]
    assert est["peak_stage"] == case["peak_stage"]
    assert _digest({k: est[k] for k in _REST_KEYS}) == case["sha256_rest"]
    assert len(est["stages"]) == len(case["stages"])
    for got, want in zip(est["stages"], case["stages"], strict=True):
        assert got["bytes"]["total"] == want["total"]
        assert _digest(_old_fields(got)) == want["sha256"], f"stage {want['stage']}"


@pytest.mark.parametrize("case", CLI, ids=lambda c: c["file"])
def test_paper_cli_output_is_byte_identical(case: dict[str, Any]) -> None:
    out = CliRunner().invoke(main, ["estimate", *case["args"]])
    assert out.exit_code == case["exit"], out.output
    want = (FIXTURES / "paper_cli" / case["file"]).read_text(encoding="utf-8")
    if "--json" not in case["args"]:
        assert out.stdout == want
        return
    got, old = json.loads(out.stdout), json.loads(want)  # JSON only ever gains fields
    assert {k: got[k] for k in _REST_KEYS} == {k: old[k] for k in _REST_KEYS}
    assert [_old_fields(s) for s in got["stages"]] == [_old_fields(s) for s in old["stages"]]
