"""The memory model: what one GPU holds while training a config, and which configs fit.

Pure by design (standard library and pydantic only; no torch, no I/O, no logging setup) so the
webhook, the supervisor and the planner can call it thousands of times per second and tests can
check it exhaustively. Two conventions: ``paper`` reproduces arXiv 2502.07846 to the byte;
``megatron`` (default) fixes what the paper leaves out. See docs/memory-model.md.
"""

from dssup.memory.config import GiB, Layout, Overheads, Precision, Training
from dssup.memory.estimate import estimate
from dssup.memory.hf import known_model_types, model_from_hf_config, preset, preset_names
from dssup.memory.plan import Candidate, PlanRequest, PlanResult, plan
from dssup.memory.result import Estimate, ParamCounts, StageBytes, StageEstimate
from dssup.memory.spec import MLASpec, ModelSpec, MoESpec

__all__ = [
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
