"""Which training frameworks can run a model, and what each contributes when none is named.

Why: the framework decides what is stored (loss, recompute, FP8 caching) and which pipeline
schedules exist. Megatron-Core runs every model dssup reads, but it has no DualPipe schedule
(no ``dualpipe`` anywhere in NVIDIA/Megatron-LM at d98e8a64dd); DeepSeek-V3 was trained with
DualPipe under DeepSeek's own code (arXiv 2412.19437 section 3.2), which dssup models for the
architecture it was written for: multi-head latent attention with DeepSeekMoE (DeepSeek-V2,
V3). A planner that assumed Megatron whenever the user named no framework could never propose
the layout DeepSeek-V3 was trained with. So, with no ``--framework``, the planner plans for
every framework that can run the model and every row names its own: Megatron for its
schedules (1F1B, interleaved), DeepSeek's code for DualPipe (its other schedules would repeat
Megatron's rows under another name). ``--framework X`` pins one, with all its schedules.
"""

from __future__ import annotations

from dssup.memory.config import Framework, Layout, Schedule
from dssup.memory.spec import ModelSpec

__all__ = ["framework_schedules", "implied_framework", "runnable_frameworks"]


def runnable_frameworks(m: ModelSpec) -> tuple[Framework, ...]:
    """Megatron for every model; DeepSeek's own code for MLA + MoE models (DeepSeek-V2/V3)."""
    if m.mla is not None and m.moe is not None:
        return ("megatron", "deepseek")
    return ("megatron",)


def framework_schedules(
    fw: Framework, frameworks: tuple[Framework, ...]
) -> tuple[Schedule, ...] | None:
    """The schedules ``fw`` contributes when the planner runs ``frameworks`` together (None:
    every schedule the search offers it)."""
    if len(frameworks) == 1 or "deepseek" not in frameworks:
        return None
    return ("dualpipe",) if fw == "deepseek" else ("1f1b", "interleaved")


def implied_framework(m: ModelSpec, layout: Layout) -> Framework | None:
    """The framework a layout implies when none is named: DualPipe on a DeepSeek-class model
    is DeepSeek's code; anything else leaves the default (None)."""
    if layout.schedule == "dualpipe" and "deepseek" in runnable_frameworks(m):
        return "deepseek"
    return None
