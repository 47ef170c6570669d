"""The configurations of the accuracy report (docs/accuracy.md) and of its CI subset.

Small shapes run for real on CPU (seconds each); two full-size configs are measured as
FakeTensorMode traces, which equal real allocation on CPU to the byte. Every config names the
calibration it is predicted with: the eager profile of its model, dtype and optimizer, traced
once (one layer of each kind, micro-batch 1-2) -- never the measured config itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dssup.memory import MLASpec, ModelSpec, MoESpec
from dssup.runtime.reference import RunSpec

__all__ = ["CI_SUBSET", "CONFIGS", "MODELS", "Config", "calibration_id", "calibration_key"]

_MLA = MLASpec(
    q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
)
_MOE = MoESpec(n_routed=8, n_shared=1, top_k=2, expert_ffn=128, shared_ffn=128, first_dense=1)
_DENSE = ModelSpec(
    name="dense-gqa", hidden=256, ffn=688, layers=4, heads=4, kv_heads=2, head_dim=64, vocab=4096
)
MODELS: dict[str, ModelSpec] = {
    "dense-gqa": _DENSE,
    "dense-mla": _DENSE.model_copy(
        update={"name": "dense-mla", "attention": "mla", "mla": _MLA, "kv_heads": 4}
    ),
    "moe-gqa": _DENSE.model_copy(update={"name": "moe-gqa", "moe": _MOE}),
    "moe-mla": _DENSE.model_copy(
        update={"name": "moe-mla", "attention": "mla", "mla": _MLA, "kv_heads": 4, "moe": _MOE}
    ),
    "moe-mla-mtp": _DENSE.model_copy(
        update={
            "name": "moe-mla-mtp",
            "attention": "mla",
            "mla": _MLA,
            "kv_heads": 4,
            "moe": _MOE.model_copy(update={"router_bias": True}),
            "mtp_depth": 1,
        }
    ),
    # full-size shapes, measured by fake traces
    "llama-0.3b": ModelSpec(
        name="llama-0.3b",
        hidden=2048,
        ffn=5504,
        layers=4,
        heads=16,
        kv_heads=4,
        head_dim=128,
        vocab=32000,
    ),
    "v2lite-3l": ModelSpec(
        name="v2lite-3l",
        hidden=2048,
        ffn=10944,
        layers=3,
        heads=16,
        kv_heads=16,
        head_dim=128,
        vocab=102400,
        attention="mla",
        mla=MLASpec(
            q_lora_rank=0,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
        moe=MoESpec(
            n_routed=64, n_shared=2, top_k=6, expert_ffn=1408, shared_ffn=1408, first_dense=1
        ),
    ),
}


@dataclass(frozen=True)
class Config:
    """One row of the report."""

    id: str
    run: RunSpec
    mode: Literal["real", "fake"]


# Data parallelism, ZeRO and offload change model states only, which the memory model computes
# exactly: a run is calibrated on one device.
_ONE_DEVICE = {"dp": 1, "zero_stage": 0, "offload_optimizer": False}


def calibration_key(run: RunSpec) -> RunSpec:
    """The run whose calibration predicts ``run``: same model, dtype, optimizer, routing,
    capacity and sequence length, on one device (dropless calibrates with real small-shape
    steps)."""
    return run.model_copy(update={"micro_batch": 1, "recompute": "none", "steps": 1, **_ONE_DEVICE})


def calibration_id(run: RunSpec) -> str:
    """The key of ``run``'s calibration in bench/accuracy.json (one-device fields left out)."""
    return calibration_key(run).model_dump_json(exclude=set(_ONE_DEVICE))


def saved_id(key: str) -> str:
    """A key saved in bench/accuracy.json as ``calibration_id`` writes it now (a field added to
    the model spec since reads as its default)."""
    return RunSpec.model_validate_json(key).model_dump_json(exclude=set(_ONE_DEVICE))


def _c(
    model: str,
    b: int,
    rc: str = "none",
    dtype: str = "fp32",
    opt: str = "foreach",
    routing: str = "capacity",
    mode: Literal["real", "fake"] = "real",
    seq: int = 256,
    dp: int = 1,
    zero: int = 0,
    offload: bool = False,
) -> Config:
    run = RunSpec.model_validate(
        {
            "model": MODELS[model],
            "micro_batch": b,
            "seq_len": seq,
            "recompute": rc,
            "dtype": dtype,
            "optimizer": opt,
            "moe_routing": routing,
            "dp": dp,
            "zero_stage": zero,
            "offload_optimizer": offload,
        }
    )
    cid = f"{model}/{dtype}/{opt}/b{b}/{rc}" + ("/dropless" if routing == "dropless" else "")
    cid += (f"/dp{dp}-z{zero}" if dp > 1 or zero else "") + ("/offload" if offload else "")
    return Config(cid, run, mode)


CONFIGS: list[Config] = [
    _c("dense-gqa", 1),
    _c("dense-gqa", 2),
    _c("dense-gqa", 4),
    _c("dense-gqa", 4, "selective"),
    _c("dense-gqa", 4, "full"),
    _c("dense-gqa", 2, dtype="bf16"),
    _c("dense-gqa", 4, "full", dtype="bf16"),
    _c("dense-gqa", 2, dtype="amp"),
    _c("dense-gqa", 4, "selective", dtype="amp"),
    _c("dense-gqa", 1, opt="fused"),
    _c("dense-gqa", 4, opt="fused"),
    _c("dense-gqa", 4, dtype="amp", opt="fused"),
    _c("dense-mla", 2),
    _c("dense-mla", 4),
    _c("dense-mla", 4, "selective"),
    _c("dense-mla", 4, "full"),
    _c("dense-mla", 2, dtype="amp"),
    _c("moe-mla", 1),
    _c("moe-mla", 2),
    _c("moe-mla", 4),
    _c("moe-mla", 4, "selective"),
    _c("moe-mla", 4, "full"),
    _c("moe-mla", 4, dtype="amp"),
    _c("moe-mla", 2, dtype="bf16"),
    _c("moe-mla", 2, routing="dropless"),
    _c("moe-mla", 4, routing="dropless"),
    _c("moe-gqa", 4),
    _c("moe-mla-mtp", 2),
    _c("llama-0.3b", 1, dtype="amp", opt="fused", mode="fake", seq=1024),
    _c("llama-0.3b", 2, dtype="amp", opt="fused", mode="fake", seq=1024),
    _c("v2lite-3l", 1, dtype="bf16", mode="fake", seq=1024),
    # Rank 0 of a data-parallel job (fake process group), ZeRO 0-2 and optimizer offload
    # (dssup.runtime.reference.zero). Full recompute keeps the optimizer-step peak on top at b1,
    # so gradient sharding (ZeRO-2) shows a saving; without it the peak moves to backward.
    _c("dense-gqa", 1, offload=True),
    _c("dense-gqa", 1, dp=2),
    _c("dense-gqa", 1, dp=2, zero=1),
    _c("dense-gqa", 1, dp=2, zero=1, offload=True),
    _c("dense-gqa", 1, "full"),
    _c("dense-gqa", 1, "full", dp=2, zero=1),
    _c("dense-gqa", 1, "full", dp=2, zero=2),
    _c("dense-gqa", 1, "full", dp=4, zero=1),
    _c("dense-gqa", 1, "full", dp=4, zero=2),
    _c("dense-gqa", 1, "full", dp=2, zero=1, offload=True),
    _c("moe-mla", 1, dp=2),
    _c("moe-mla", 1, dp=2, zero=1),
    _c("moe-mla", 1, "full", dp=2),
    _c("moe-mla", 1, "full", dp=2, zero=1),
    _c("moe-mla", 1, "full", dp=2, zero=2),
    _c("moe-mla", 1, "full", dp=2, zero=1, offload=True),
    _c("moe-mla", 1, "full", dp=2, zero=2, offload=True),
]

# The CI regression subset: one calibration (dense-gqa fp32 foreach) and real runs covering an
# optimizer-step peak, backward peaks, micro-batch halving, a recompute level, ZeRO 0 -> 1 and
# 1 -> 2 on two data-parallel ranks, and optimizer offload (one at full recompute, where the peak
# is the end of backward).
CI_SUBSET: list[str] = [
    "dense-gqa/fp32/foreach/b1/none",
    "dense-gqa/fp32/foreach/b2/none",
    "dense-gqa/fp32/foreach/b4/none",
    "dense-gqa/fp32/foreach/b4/selective",
    "dense-gqa/fp32/foreach/b1/none/offload",
    "dense-gqa/fp32/foreach/b1/none/dp2-z0",
    "dense-gqa/fp32/foreach/b1/none/dp2-z1",
    "dense-gqa/fp32/foreach/b1/full/dp2-z1",
    "dense-gqa/fp32/foreach/b1/full/dp2-z2",
    "dense-gqa/fp32/foreach/b1/full/dp2-z1/offload",
]
