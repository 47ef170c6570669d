"""What "fits" means, in one place: the memory CUDA can allocate, the extra margin a user asks
for, and the band of the memory model's own uncertainty.

Why no flat default margin: the predicted peak already contains what a flat percentage used to
stand in for. The CUDA context is a term of its own (``Overheads.cuda_context_bytes``), the
caching allocator's fragmentation another (a fraction of the allocated bytes), the
communication buffers a third. What is left between a prediction and the GPU is (a) the memory
the driver keeps for itself, which CUDA never hands out, and (b) the model's own error. (a) is
known per GPU: ``totalGlobalMem`` (the GPU table's ``cuda_memory_bytes``, e.g. 81,106 MiB of an
H100's 81,559), so the fit is judged against that, not against what ``nvidia-smi`` or the
GFD label reports; for a GPU without such a capture the driver total is cut by the largest
reservation the table's captures show. (b) is not a reason to hide a config: a published run
used its GPU to within 1-2 % (DeepSeek-V3 on H800), so a default margin of 5 % excluded
recipes known to run. Configs within the model's uncertainty of the limit are flagged instead
(``band``), and ``--margin`` keeps extra headroom for a user who wants it.

The bands, per framework, and where they come from:

* ``transformers``: 2.4 %: the uncalibrated formula's worst under-prediction against 480
  measured training steps (docs/accuracy.md; CPU allocator, so the CUDA side is the modelled
  fragmentation and context);
* a traced profile (``dssup calibrate``): 2 %, docs/accuracy.md's acceptance band (353/353
  within, worst -0.42 %);
* ``deepspeed``: 10.8 %: the largest gap to DeepSpeed 0.19.8's own estimators (ZeRO-3 without
  offload, Llama-3-70B; 18 of 20 cases within 5 %, docs/memory-model.md);
* ``megatron``, ``deepseek``, the paper convention: 5 %. Not measured on a GPU (none has been
  lent to this project); 5 % is the spread of the model against DeepSpeed's estimators in 18
  of 20 cases, an assumption stated as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssup.memory.config import Framework
from dssup.memory.gpu_spec import GpuSpec

__all__ = [
    "DEFAULT_MARGIN",
    "Band",
    "band",
    "budget",
    "cuda_bytes",
    "cuda_note",
    "driver_reserve_fraction",
    "margin_words",
    "near_limit",
    "near_words",
    "usable_bytes",
    "usable_note",
]

#: Extra fraction of the usable memory kept free by default: none (see the module docstring).
DEFAULT_MARGIN = 0.0


@dataclass(frozen=True, slots=True)
class Band:
    """How far the memory model may be below a real peak, and where that figure comes from."""

    fraction: float
    source: str


_UNMEASURED = Band(
    0.05,
    "not measured on a GPU; 5 % = the model's spread against DeepSpeed's estimators in 18 of "
    "20 cases (docs/memory-model.md), an assumption",
)
_BANDS: dict[str, Band] = {
    "transformers": Band(
        0.024, "worst of 480 measured CPU training steps, -2.40 % (docs/accuracy.md)"
    ),
    "deepspeed": Band(
        0.108, "largest gap to DeepSpeed 0.19.8's estimators, -10.8 % (docs/memory-model.md)"
    ),
    "traced": Band(0.02, "a traced profile's acceptance band, -2 % (docs/accuracy.md)"),
}


def band(framework: Framework | None, traced: bool = False) -> Band:
    """The uncertainty band of the memory model for this framework (or a traced profile)."""
    if traced:
        return _BANDS["traced"]
    return _BANDS.get(framework or "megatron", _UNMEASURED)


def budget(capacity_bytes: int, margin: float) -> int:
    """Bytes a config may need: the usable capacity less the user's extra ``margin``."""
    return int(capacity_bytes * (1.0 - margin))


def near_limit(peak_bytes: int, capacity_bytes: int, b: Band) -> bool:
    """Whether a fitting config's peak is within the model's uncertainty of the capacity."""
    return peak_bytes > capacity_bytes * (1.0 - b.fraction)


def driver_reserve_fraction(table: tuple[GpuSpec, ...]) -> float:
    """The largest share of the driver total that a captured GPU keeps from CUDA."""
    shares = [
        1 - g.cuda_memory_bytes / g.memory_bytes for g in table if g.cuda_memory_bytes is not None
    ]
    return max(shares, default=0.0)


def usable_bytes(spec: GpuSpec, reserve_fraction: float) -> int:
    """Bytes CUDA can allocate on ``spec``: its captured ``totalGlobalMem``, else the driver
    total less ``reserve_fraction`` of it (``driver_reserve_fraction``, never more)."""
    return cuda_bytes(spec.memory_bytes, spec, reserve_fraction)


def cuda_bytes(total_bytes: int, spec: GpuSpec | None, reserve_fraction: float) -> int:
    """Bytes CUDA can allocate of a GPU whose driver total is ``total_bytes`` (what NVML, GFD's
    ``nvidia.com/gpu.memory`` label and ``nvidia-smi`` report): less what the driver keeps,
    as captured for ``spec`` (its ``memory_bytes - cuda_memory_bytes``), else
    ``reserve_fraction`` of the total (the largest captured share)."""
    if spec is not None and spec.cuda_memory_bytes is not None:
        return max(0, total_bytes - (spec.memory_bytes - spec.cuda_memory_bytes))
    return int(total_bytes * (1.0 - reserve_fraction))


def cuda_note(spec: GpuSpec | None, reserve_fraction: float) -> str:
    """How ``cuda_bytes`` found what the driver keeps, in a few words."""
    if spec is not None and spec.cuda_memory_bytes is not None:
        kept = (spec.memory_bytes - spec.cuda_memory_bytes) / (1 << 20)
        return f"the driver keeps {kept:.0f} MiB (totalGlobalMem of {spec.name})"
    return (
        f"the driver keeps {reserve_fraction:.2%}, estimated (the largest share a captured GPU "
        "keeps)"
    )


def margin_words(margin: float) -> str:
    """What a decision says of the user's margin: none by default (``DEFAULT_MARGIN``)."""
    return f"with a {margin:.0%} margin" if margin else "with no margin"


def near_words(b: Band) -> str:
    """How a decision says a fitting config is within the model's uncertainty of the limit
    (the planner's rows, ``estimate``, the webhook, the supervisor): the band and its source."""
    return (
        f"near the limit: within the memory model's {b.fraction:.1%} uncertainty of the GPU "
        f"({b.source})"
    )


def usable_note(spec: GpuSpec, reserve_fraction: float) -> str:
    """Where ``usable_bytes`` comes from, for the assumptions."""
    total = f"the driver total {spec.memory_mib} MiB (nvidia-smi, GFD label)"
    if spec.cuda_memory_bytes is not None:
        return (
            f"{spec.name}: {spec.cuda_memory_bytes / (1 << 30):.2f} GiB that CUDA can allocate "
            f"(totalGlobalMem: {spec.cuda_memory_source}), less than {total}"
        )
    nbytes = usable_bytes(spec, reserve_fraction)
    return (
        f"{spec.name}: {nbytes / (1 << 30):.2f} GiB that CUDA can allocate, estimated: {total} "
        f"less {reserve_fraction:.2%}, the largest driver reservation of the GPUs whose "
        "totalGlobalMem is captured (no capture of this GPU's; give --gpu-memory in bytes to "
        "state it)"
    )
