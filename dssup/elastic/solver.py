"""The global-batch solver: DeepSpeed's elasticity turned around.

DeepSpeed chooses a global batch that suits many GPU counts; users want *their* global batch.
``solve`` takes the batch as fixed and, for every node count in ``--nnodes MIN:MAX``, lists the
data-parallel size, every (micro-batch, accumulation) pair that keeps the batch exact, and, per
GPU type, the pairs the memory model says fit (at some ZeRO stage, recompute and offload) with
the cheapest such plan. World sizes that cannot keep the batch are listed too, with the reason,
so an operator sees which ``maxReplicas`` are useless before the cluster shrinks to them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dssup.elastic.batch import NodeRange, Split, dp_size, splits
from dssup.elastic.fit import Fitted, MemoryContext, search_plans
from dssup.errors import ConfigError

__all__ = ["ElasticRequest", "ElasticRow", "ElasticTable", "GpuFit", "solve"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ElasticRequest(BaseModel):
    """A fixed global batch and the world sizes the job may run at."""

    model_config = _FROZEN
    global_batch: int = Field(gt=0, description="sequences per optimizer step; kept exact")
    nodes: NodeRange = Field(description="torchrun --nnodes MIN:MAX")
    nproc_per_node: int = Field(1, ge=1, description="GPUs (ranks) per node")
    model_parallel: int = Field(1, ge=1, description="GPUs per model replica: TP x PP x CP")
    micro_batches: tuple[int, ...] | None = Field(None, description="allowed; None = any")
    max_micro_batch: int | None = Field(None, ge=1, description="largest micro-batch listed")


class GpuFit(BaseModel):
    """Memory verdict for one world size on one GPU type."""

    model_config = _FROZEN
    gpu: str = Field(description="GPU name or size as given")
    memory_bytes: int = Field(description="GPU memory, bytes")
    fitting_micro_batches: tuple[int, ...] = Field(description="micro-batches that fit somehow")
    best: Fitted | None = Field(description="cheapest fitting plan; None when nothing fits")
    problem: str = Field("", description="why the memory model could not evaluate this row")


class ElasticRow(BaseModel):
    """One node count of the range."""

    model_config = _FROZEN
    nnodes: int
    world_size: int
    dp: int | None = Field(description="data-parallel size; None when the world does not divide")
    compatible: bool = Field(description="some split keeps the global batch exact")
    reason: str = Field("", description="why not, when incompatible")
    splits: tuple[Split, ...] = Field(description="every exact (micro, accumulation) pair")
    memory: tuple[GpuFit, ...] = Field((), description="per GPU type, when a model was given")


class ElasticTable(BaseModel):
    model_config = _FROZEN
    request: ElasticRequest
    rows: tuple[ElasticRow, ...]

    @property
    def compatible_nnodes(self) -> list[int]:
        return [r.nnodes for r in self.rows if r.compatible]

    def row(self, nnodes: int) -> ElasticRow:
        for r in self.rows:
            if r.nnodes == nnodes:
                return r
        raise KeyError(nnodes)


def _row(req: ElasticRequest, nnodes: int) -> ElasticRow:
    world = nnodes * req.nproc_per_node
    dp = dp_size(world, req.model_parallel)
    if dp is None:
        reason = f"{world} GPUs is not a multiple of TP x PP x CP = {req.model_parallel}"
        return ElasticRow(
            nnodes=nnodes, world_size=world, dp=None, compatible=False, reason=reason, splits=()
        )
    found = tuple(splits(req.global_batch, dp, req.micro_batches, req.max_micro_batch))
    reason = ""
    if req.global_batch % dp:
        reason = f"DP {dp} does not divide the global batch {req.global_batch}"
    elif not found:
        reason = "no allowed micro-batch divides the per-rank share"
    return ElasticRow(
        nnodes=nnodes,
        world_size=world,
        dp=dp,
        compatible=bool(found),
        reason=reason,
        splits=found,
    )


def _fit(row: ElasticRow, ctx: MemoryContext, gpu: str, memory: int, gb: int) -> GpuFit:
    sized = ctx.model_copy(update={"gpu_memory_bytes": memory})
    micro = [s.micro_batch for s in row.splits]
    try:
        found = search_plans(sized, row.world_size, gb, micro_batches=micro)
    except ConfigError as exc:
        return GpuFit(
            gpu=gpu, memory_bytes=memory, fitting_micro_batches=(), best=None, problem=str(exc)
        )
    fitting = tuple(sorted({f.plan.micro_batch for f in found}))
    return GpuFit(
        gpu=gpu,
        memory_bytes=memory,
        fitting_micro_batches=fitting,
        best=found[0] if found else None,
    )


def solve(
    req: ElasticRequest,
    memory: MemoryContext | None = None,
    gpus: dict[str, int] | None = None,
) -> ElasticTable:
    """The table for every node count; with ``memory`` and ``gpus`` (name -> bytes), also
    which splits fit each GPU type. The memory context's layout fixes ``model_parallel``."""
    if memory is not None and memory.model_parallel != req.model_parallel:
        req = req.model_copy(update={"model_parallel": memory.model_parallel})
    rows = []
    for n in req.nodes.nodes():
        row = _row(req, n)
        if memory is not None and gpus and row.compatible:
            fits = tuple(_fit(row, memory, g, b, req.global_batch) for g, b in gpus.items())
            row = row.model_copy(update={"memory": fits})
        rows.append(row)
    return ElasticTable(request=req, rows=tuple(rows))
