"""The other peaks of an eager training step (transformers), besides the start of backward.

Eager PyTorch differs from Megatron in two ways that move the peak:

* ``zero_grad(set_to_none=True)`` frees gradients after every step, so they appear during
  backward, layer by layer: the peak can be the last layer's backward (the head's gradient
  done, the loss's FP32 tensors already freed) or the first layer's (every gradient but the
  embedding's and that layer's) -- with checkpointing the latter usually wins (measured with
  MemTracker on transformers' Llama: the peak is in layer 0's MLP backward);
* under ``torch.autocast`` every linear layer's weight is cast to bf16 once per forward and
  that copy is saved for its backward (2 bytes per linear parameter until that layer's
  backward); with checkpointing the copies live in autocast's cache until the forward ends, so
  the end of forward (every copy, plus the logits, their FP32 cast and the log-softmax) can be
  the peak.

Each moment is (parameters whose gradients exist by then, batch-independent bytes, per-sample
bytes); ``core.tails`` turns them into bytes for a config, the planner evaluates them like the
start of backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dssup.memory.activations import FULL_KEEP, Ctx, Term, keep, layer_terms, stage_io_terms
from dssup.memory.config import RECOMPUTE_LEVELS, Layout, Recompute
from dssup.memory.eager import autocast
from dssup.memory.params import attention_params, mlp_params
from dssup.memory.stages import StageParams, layer_params

__all__ = ["Moment", "eager_moments"]

LayerWork = Callable[[Ctx, list[Term], bool, Recompute, tuple[bool, ...]], int]


@dataclass(frozen=True, slots=True)
class Moment:
    grad_params: int  # parameters whose gradients exist at this moment (0: not counted)
    const: dict[Recompute, int]  # batch-independent bytes
    per_sample: dict[Recompute, int]


def _linear_params(c: Ctx, moe_layer: bool) -> int:
    """Parameters of one layer that autocast casts (attention, dense or shared FFN, router)."""
    m = c.m
    out = attention_params(m, c.t, c.conv)
    if not moe_layer or m.moe is None:
        return out + mlp_params(m, c.t)
    return out + m.moe.n_shared * 3 * m.hidden * m.moe.shared_ffn // c.t + m.moe.n_routed * m.hidden


def _copies(c: Ctx, sp: StageParams, kinds: tuple[bool, ...]) -> tuple[int, int]:
    """(autocast copies of every layer of the stage, of its largest layer), lm_head included."""
    if not autocast(c) or not kinds:
        return 0, 0
    head = sp.embedding if sp.last else 0
    every = sum(_linear_params(c, moe) for moe in kinds) + head
    largest = max(_linear_params(c, moe) for moe in set(kinds)) + head
    return 2 * every, 2 * largest


def _kept(c: Ctx, layer: list[Term], rc: Recompute) -> int:
    if rc == "full":
        return sum(t.bytes for t in layer if t.group in FULL_KEEP)
    return sum(t.bytes for t in layer if keep(t.group, rc, c))


def eager_moments(
    c: Ctx,
    sp: StageParams,
    kinds: tuple[bool, ...],
    layout: Layout,
    acts: dict[Recompute, int],
    work: LayerWork,
) -> tuple[dict[Recompute, int] | None, tuple[Moment, ...]]:
    """(batch-independent saved bytes at the start of backward, the other moments) of a stage
    run by an eager framework; (None, ()) otherwise."""
    if not c.eager or c.r is None or not kinds:
        return None, ()
    every, largest = _copies(c, sp, kinds)
    const = {rc: largest if rc == "full" else every for rc in RECOMPUTE_LEVELS}
    if not (sp.first and sp.last and c.r.framework == "transformers"):
        return const, ()
    first, last = layer_terms(c, kinds[0]), layer_terms(c, kinds[-1])
    io = stage_io_terms(c, True, True, [])
    loss_io = sum(t.bytes for t in io if t.name.startswith(("head.", "loss.")))
    ids = sum(t.bytes for t in io if t.name.startswith("embed."))
    head = c.m.hidden + (0 if c.m.tie_embeddings else sp.embedding)
    after_first = sp.split.total - sp.embedding - layer_params(c.m, layout, c.conv, kinds[0])
    last_layer, first_layer, fwd_end = {}, {}, {}
    logits = (c.act + (4 if c.act != 4 else 0)) * c.vocab * c.s // c.t
    for rc in RECOMPUTE_LEVELS:
        last_layer[rc] = acts[rc] - loss_io + work(c, last, kinds[-1], rc, kinds)
        first_layer[rc] = ids + _kept(c, first, rc) + work(c, first, kinds[0], rc, kinds)
        fwd_end[rc] = acts[rc] + logits
    return const, (
        Moment(head, const, last_layer),
        Moment(after_first, const, first_layer),
        Moment(0, dict.fromkeys(RECOMPUTE_LEVELS, every), fwd_end),
    )
