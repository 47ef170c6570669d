"""What each DeepSpeed rung is predicted to save at the failure's phase, per rank.

Why: a rung should be chosen by what it saves *where the job failed*, not by a fixed order.
Two sources of prediction, best first:

* a model description (``MemoryContext``, from ``dssup run --model``): ``dssup.memory.estimate``
  of the current plan and of each candidate; the saving is the difference of the peaks;
* the job's own checkpoint (``ParamContext``): its parameter count (``param_shapes``, read
  without torch) and precision give the model states per rank under each ZeRO stage and
  offload (``dssup.memory.zero.model_states``). Used for optimizer, load and init failures
  only: there the model states are what is live; in forward and backward the activations
  dominate and a checkpoint says nothing about them.

At the optimizer step DeepSpeed (0.19) has already reduced a ZeRO-1 job's gradients into each
rank's partition, so ZeRO-2 saves nothing there (measured: the two peak within 0.2 %): the
memory model scores ZeRO-2 as ZeRO-1 (no credit for a saving it does not make), the model
states count ZeRO-1's gradients as partitioned (what it holds at the step). For the example
job at 2 ranks in bf16 this predicts ZeRO-3 saves half the bf16 weights at the step, which is
the measured difference (ZeRO-1 +2q, ZeRO-3 +1.5q above the resident state, q the weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from pathlib import Path

from dssup.errors import DssupError
from dssup.memory import Layout, ModelSpec, Overheads, Precision, Training, estimate
from dssup.memory.capacity import DEFAULT_MARGIN, Band
from dssup.memory.steptime import step_time
from dssup.memory.topology import Topology
from dssup.memory.zero import model_states
from dssup.supervisor.deepspeed.ckpt_info import UNREADABLE, CheckpointInfo, read_pickled_tree
from dssup.supervisor.models import TrainingPlan

__all__ = [
    "MemoryContext",
    "ParamContext",
    "param_context",
    "predicted_band",
    "predicted_peak",
    "predicted_step_time",
    "state_bytes",
]

MODEL_STATE_PHASES = frozenset({"optimizer", "load", "init"})


@dataclass(frozen=True)
class MemoryContext:
    """What the memory model needs to predict a DeepSpeed option's peak."""

    model: ModelSpec
    layout: Layout
    base: Training  # seq_len, precision, ... (micro-batch and ZeRO come from the plan)
    gpu_memory_bytes: int
    overheads: Overheads | None = None
    margin: float = DEFAULT_MARGIN  # extra fraction kept free (``dssup run --margin``)
    topology: Topology | None = None  # the GPU the planner's step times are for


@dataclass(frozen=True)
class ParamContext:
    """The job's parameter count and precision, as its checkpoint records them."""

    params: int
    half: bool  # bf16/fp16 weights and gradients with an fp32 master copy
    source: str  # for the journal: which checkpoint said so


def _at_phase(plan: TrainingPlan, phase: str) -> TrainingPlan:
    if phase == "optimizer" and plan.zero_stage == 2:
        return plan.model_copy(update={"zero_stage": 1})
    return plan


def _to_training(plan: TrainingPlan, base: Training) -> Training:
    return base.model_copy(
        update={
            "micro_batch": plan.micro_batch or base.micro_batch,
            "grad_accum": plan.grad_accum or base.grad_accum,
            "recompute": plan.recompute if plan.recompute != "none" else base.recompute,
            "zero_stage": plan.zero_stage,
            "offload_optimizer": plan.offload != "none",
            "offload_params": plan.offload == "optimizer+params",
        }
    )


def predicted_peak(mem: MemoryContext, plan: TrainingPlan, phase: str) -> int | None:
    """The memory model's peak for ``plan`` as seen at ``phase`` (None: cannot estimate)."""
    try:
        training = _to_training(_at_phase(plan, phase), mem.base)
        return estimate(mem.model, mem.layout, training, mem.overheads).peak_bytes
    except DssupError:
        return None


def predicted_band(mem: MemoryContext) -> Band | None:
    """The memory model's uncertainty band for the job's framework (``capacity.band``, as
    ``estimate`` reports it); None when the memory model cannot evaluate the job."""
    try:
        est = estimate(mem.model, mem.layout, mem.base, mem.overheads)
    except DssupError:
        return None
    return Band(est.uncertainty, est.uncertainty_source) if est.uncertainty is not None else None


def predicted_step_time(mem: MemoryContext, plan: TrainingPlan) -> float | None:
    """The planner's predicted seconds per step for ``plan`` (``dssup.memory.step_time``, the
    ranking ``dssup plan`` uses); None when the memory model cannot evaluate it."""
    try:
        training = _to_training(plan, mem.base)
        layout = mem.layout.model_copy(update={"dp": plan.dp}) if plan.dp else mem.layout
        return step_time(mem.model, layout, training, mem.topology)["total"]
    except DssupError:
        return None


def state_bytes(pc: ParamContext, plan: TrainingPlan, phase: str) -> int:
    """Device bytes of weights, gradients and optimizer states per rank for ``plan``.

    At the optimizer step a ZeRO-1 job holds only its gradient partition, like ZeRO-2.
    """
    stage = 2 if phase == "optimizer" and plan.zero_stage == 1 else plan.zero_stage
    width = 2 if pc.half else 4
    precision = Precision(weights=width, gradients=width, master=4 if pc.half else 0)
    states = model_states(
        pc.params, 0, plan.dp, plan.dp, stage, precision,
        offload_optimizer=plan.offload != "none",
        offload_params=plan.offload == "optimizer+params",
    )  # fmt: skip
    return states.weights + states.gradients + states.optimizer


def _model_file(tag_dir: Path) -> Path | None:
    files = sorted(tag_dir.glob("*model_states.pt"))
    return files[0] if files else None


def param_context(info: CheckpointInfo | None) -> ParamContext | None:
    """Parameter count from the checkpoint's ``param_shapes`` (None when it has none)."""
    path = _model_file(info.path) if info is not None else None
    if info is None or path is None:
        return None
    try:
        groups = read_pickled_tree(path).get("param_shapes") or []
        params = sum(prod(shape) for group in groups for shape in dict(group).values())
    except (*UNREADABLE, TypeError, ValueError, AttributeError):  # no prediction, no failure
        return None
    cfg = info.ds_config
    half = info.bf16 or any(bool((cfg.get(k) or {}).get("enabled")) for k in ("bf16", "fp16"))
    if params <= 0:
        return None
    return ParamContext(params, half, f"checkpoint {info.tag}: {params:,} parameters")
