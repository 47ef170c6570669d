"""The planner's request and result: what to search, and the configs that fit, fastest first.

Why a module of its own: these are the planner's wire shapes (``dssup plan --json``, the
webhook's and the supervisor's calls), read by code that never runs the search; the search
itself is ``search.py`` and its orchestration ``plan.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.memory.config import (
    RECOMPUTE_LEVELS,
    Convention,
    Framework,
    Layout,
    Overheads,
    Recompute,
    Training,
)
from dssup.memory.cost import CostModel
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Topology

__all__ = ["BandInfo", "Candidate", "PlanRequest", "PlanResult"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PlanRequest(BaseModel):
    """What to plan for. ``layout`` fixes TP/PP/EP/ETP/CP/schedule unless ``search_parallelism``."""

    model_config = _FROZEN
    model: ModelSpec
    gpu_memory_bytes: int = Field(gt=0, description="usable memory per GPU, bytes")
    global_batch: int = Field(gt=0, description="sequences per optimizer step; kept exact")
    world_size: int | None = Field(None, gt=0, description="GPUs; default layout.world_size")
    layout: Layout = Field(default_factory=Layout)
    training: Training = Field(default_factory=Training, description="base knobs (seq_len, ...)")
    overheads: Overheads | None = None
    convention: Convention = "megatron"
    recompute: tuple[Recompute, ...] = RECOMPUTE_LEVELS
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    allow_offload: bool = Field(True, description="consider optimizer and parameter offload")
    search_parallelism: bool = Field(
        False,
        description="also vary TP, PP, EP and the pipeline schedule (1F1B, interleaved "
        "VPP, DualPipe for MoE models)",
    )
    fixed: tuple[Literal["tp", "pp", "ep", "schedule", "vpp"], ...] = Field(
        (), description="layout fields the parallelism search keeps as given in ``layout``"
    )
    offloads: tuple[Literal["none", "optimizer", "both"], ...] | None = Field(
        None, description="offload choices to consider; None: all when allow_offload"
    )
    max_tp: int = Field(8, ge=1, description="largest TP to consider (one node)")
    max_vpp: int = Field(
        32, ge=1, description="largest virtual-pipeline size the search tries (interleaved)"
    )
    micro_batches: tuple[int, ...] | None = Field(None, description="None = every divisor")
    margin: float = Field(
        DEFAULT_MARGIN,
        ge=0,
        lt=1,
        description="extra fraction of the usable GPU memory kept free, on top of the modelled "
        "context, buffers and fragmentation (capacity.py); default none",
    )
    search_splits: bool = Field(
        False,
        description="also try the uneven pipeline splits of splits.py (Megatron's account-for-"
        "embedding/loss and first/last-stage layer counts) for layouts without a given split; "
        "each config keeps its best split",
    )
    bound: bool = Field(
        False,
        description="rank the first ``limit`` rows without sweeping every layout: layouts are "
        "swept in the order of a lower bound on their step time and skipped once it cannot "
        "reach the kept rows (bound.py); counts then cover the layouts swept",
    )
    frameworks: tuple[Framework, ...] | None = Field(
        None,
        description="training frameworks to plan for, each row naming its own; None: "
        "training.framework's. With DeepSeek's among several, it contributes the DualPipe "
        "layouts and the others the rest (frameworks.py)",
    )
    cost: CostModel = Field(default_factory=CostModel, description="step-time model settings")
    topology: Topology | None = Field(
        None,
        description="GPUs, links and hosts the step time is for; None: an H100 DGX node "
        "from the GPU table, with a warning",
    )
    limit: int = Field(50, ge=1, description="most candidates returned")
    host_memory_bytes: int | None = Field(
        None, gt=0, description="host memory per node, bytes; None = not checked"
    )
    gpus_per_node: int = Field(8, ge=1, description="GPUs sharing one host (per node)")


class Candidate(BaseModel):
    """One config, its predicted peak and its cost."""

    model_config = _FROZEN
    layout: Layout
    training: Training
    peak_bytes: int
    peak_stage: int
    phase: str
    fits: bool
    headroom_bytes: int
    step_time_s: float = Field(description="predicted seconds per optimizer step")
    cost_terms: dict[str, float] = Field(
        description="the step time by term, seconds; 'total' is their sum (docs/step-time.md)"
    )
    traffic: dict[str, float] = Field(
        default_factory=dict, description="seconds of each communication per step before overlap"
    )
    host_bytes_per_node: int = Field(
        0, description="gpus_per_node x the largest per-GPU host need (offload, model build)"
    )
    near_limit: bool = Field(
        False,
        description="the peak is within the memory model's uncertainty band of the GPU "
        "(PlanResult.bands): it fits by the model, by less than the model's own error",
    )


class BandInfo(BaseModel):
    """The uncertainty band one framework's rows were flagged with (capacity.py)."""

    model_config = _FROZEN
    framework: str
    fraction: float
    source: str


class PlanResult(BaseModel):
    model_config = _FROZEN
    candidates: list[Candidate] = Field(description="configs that fit, cheapest first")
    evaluated: int = Field(description="configs whose memory was computed")
    fitting: int = Field(description="configs that fit (before the limit)")
    closest: Candidate | None = Field(description="smallest peak among those that do not fit")
    closest_fits_gpu: bool = Field(
        False, description="the closest config fits the GPU and misses only the margin"
    )
    topology: Topology = Field(description="the hardware the step times were computed for")
    warnings: list[str] = Field(default_factory=list, description="inputs that were missing")
    host_limited: int = Field(0, description="configs that fit the GPU but not the host memory")
    host_limited_bytes: int | None = Field(
        None, description="smallest host need per node among the host-limited configs"
    )
    bands: list[BandInfo] = Field(
        default_factory=list, description="the near-limit band of each planned framework"
    )
    near_limit: int = Field(0, description="fitting configs flagged near_limit (before the limit)")
    layouts_skipped: int = Field(
        0,
        description="layouts not swept: their step-time lower bound could not reach the rows "
        "kept (PlanRequest.bound); 0 for an exhaustive search",
    )
    layouts_swept: int = Field(0, description="layouts whose configs were evaluated")
