"""Which layers live on which pipeline stage, which stages each device holds, and the
parameters one GPU of each stage holds.

Embedding goes on the first stage, the final norm, head and MTP on the last (spec section 4).
The even split fills stages with ceil(l/n) layers and leaves the remainder to the last one
(the paper's V3 partition: 4 x 15 + 1); when that would leave a stage empty it balances instead.
With interleaving there are pp*vpp (virtual) stages; ``placement`` says which a device holds:
1F1B rank i holds stage i; interleaved rank i holds stages i, i+pp, ..., i+(vpp-1)*pp (Megatron
``get_model(..., vp_stage)``); DualPipe rank i holds stages i and pp-1-i (deepseek-ai/DualPipe
``examples/example_dualpipe.py``: ``full_modules[rank], full_modules[pp_size - 1 - rank]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from dssup.memory.config import Convention, Layout
from dssup.memory.memo import ModelMemo
from dssup.memory.params import (
    Split,
    attention_params,
    embedding_params,
    head_extra_params,
    mlp_params,
    moe_params,
    mtp_block_params,
    norm_params,
    positions_params,
)
from dssup.memory.spec import ModelSpec

__all__ = [
    "StageKind",
    "StageParams",
    "kind_params",
    "layer_params",
    "padded_vocab",
    "partition",
    "placement",
    "stage_params",
]


def placement(layout: Layout) -> list[tuple[int, ...]]:
    """The stages each pipeline rank (device) holds, in the order it holds them."""
    pp = layout.pp
    if layout.schedule == "dualpipe":
        return [(i, pp - 1 - i) for i in range(pp)]
    return [tuple(c * pp + i for c in range(layout.vpp)) for i in range(pp)]


def partition(layers: int, layout: Layout) -> list[range]:
    """Global layer indices of each (virtual) stage."""
    pp = layout.stages
    if layout.layers_per_stage is not None:
        counts = list(layout.layers_per_stage)
    else:
        per = -(-layers // pp)
        if per * (pp - 1) < layers:
            counts = [per] * (pp - 1) + [layers - per * (pp - 1)]
        else:
            q, r = divmod(layers, pp)
            counts = [q + 1 if i < r else q for i in range(pp)]
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def padded_vocab(m: ModelSpec, tp: int, conv: Convention, pad: bool = True) -> int:
    """Megatron pads the vocabulary to a multiple of 128 * tp; the paper and eager
    frameworks (``pad=False``) do not."""
    if conv == "paper" or not pad:
        return m.vocab
    unit = 128 * tp
    return -(-m.vocab // unit) * unit


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters of one GPU of a stage, and the largest single layer (ZeRO-3 working set)."""

    split: Split
    largest_layer: int
    attention_layers: int
    moe_layers: int
    dense_layers: int
    first: bool
    last: bool
    mtp: bool = False  # holds the MTP modules
    embedding: int = 0  # parameters of one embedding (or head) matrix on this GPU
    largest_tensor: int = 0  # elements of the largest parameter tensor (forloop Adam)


_LAYERS = ModelMemo(1024)
_STAGES = ModelMemo(8192)
_PREFIX = ModelMemo(64)


def _layer(m: ModelSpec, layout: Layout, conv: Convention, is_moe: bool) -> Split:
    key = (layout.tp, layout.ep, layout.etp, conv, is_moe)
    return _LAYERS.get(
        m, key, lambda: _layer_cached(m, layout.tp, layout.ep, layout.etp, conv, is_moe)
    )


def layer_params(m: ModelSpec, layout: Layout, conv: Convention, is_moe: bool) -> int:
    """Parameters of one layer on one GPU (after TP/EP split)."""
    return _layer(m, layout, conv, is_moe).total


def _layer_cached(
    m: ModelSpec, tp: int, ep: int, etp: int, conv: Convention, is_moe: bool
) -> Split:
    layout = _split_layout(tp, ep, etp)
    base = Split(non_moe=norm_params(m) + attention_params(m, layout.tp, conv))
    if is_moe:
        return base + moe_params(m, layout, conv)
    return base + Split(non_moe=mlp_params(m, layout.tp))


@lru_cache(maxsize=256)
def _split_layout(tp: int, ep: int, etp: int) -> Layout:
    """The layout the parameter formulas read (TP, EP, ETP), built once per split: a
    validated ``Layout`` costs more than the arithmetic it feeds."""
    return Layout(tp=tp, ep=ep, etp=etp, dp=ep * etp)


def moe_layers_in(m: ModelSpec, layers: range) -> int:
    """MoE layers among ``layers`` (prefix sums, cached per model)."""
    prefix = _PREFIX.get(m, None, lambda: _moe_prefix(m))
    return prefix[layers.stop] - prefix[layers.start] if len(layers) else 0


def _moe_prefix(m: ModelSpec) -> tuple[int, ...]:
    out = [0]
    for i in range(m.layers):
        out.append(out[-1] + int(m.is_moe_layer(i)))
    return tuple(out)


def stage_params(
    m: ModelSpec,
    layout: Layout,
    conv: Convention,
    layers: range,
    stage: int,
    mtp: bool = True,
    pad: bool = True,
) -> StageParams:
    """Parameters of one GPU of ``stage`` (cached on what they depend on). ``mtp``: whether the
    training code builds the model's MTP modules (megatron convention only); ``pad``: whether
    it pads the vocabulary (Megatron does)."""
    moe = moe_layers_in(m, layers)
    first, last = stage == 0, stage == layout.stages - 1
    lay = layout
    kind = StageKind(lay.tp, lay.ep, lay.etp, conv, moe, len(layers) - moe, first, last, mtp, pad)
    return kind_params(m, kind)


class StageKind(NamedTuple):
    """What one GPU of a stage holds, which is all its parameters depend on: the TP/EP/ETP
    split, the convention, its MoE and dense layers, whether it is the first and/or last
    stage (embedding, head), and whether MTP modules are built and the vocabulary padded."""

    tp: int
    ep: int
    etp: int
    conv: Convention
    moe_layers: int
    dense_layers: int
    first: bool
    last: bool
    mtp: bool = True
    pad: bool = True


def kind_params(m: ModelSpec, kind: StageKind) -> StageParams:
    """``stage_params`` of a stage given by what it holds (cached)."""
    return _STAGES.get(m, kind, lambda: _stage_params(m, kind))


def _stage_params(m: ModelSpec, kind: StageKind) -> StageParams:
    tp, ep, etp, conv, moe_layers, dense_layers, first, last, mtp, pad = kind
    layout = _split_layout(tp, ep, etp)
    total, largest = Split(), 0
    for is_moe, count in ((True, moe_layers), (False, dense_layers)):
        if count:
            one = _layer(m, layout, conv, is_moe)
            total += one.scale(count)
            largest = max(largest, one.total)
    if conv == "megatron":
        vocab = padded_vocab(m, layout.tp, conv, pad)
        emb = embedding_params(m, layout.tp, vocab)
        if first:
            total += Split(non_moe=emb + positions_params(m))
        if last:
            head = 0 if (m.tie_embeddings and first) else emb
            total += Split(non_moe=head + head_extra_params(m, layout.tp, vocab))
            if m.mtp_depth and mtp:
                block = mtp_block_params(m, layout, conv, layout.tp).scale(m.mtp_depth)
                total += block
                largest = max(largest, block.total // m.mtp_depth)
        largest = max(largest, emb)
    elif conv == "paper" and (first or last):
        emb = embedding_params(m, layout.tp, m.vocab)
        total += Split(non_moe=emb * (int(first) + int(last and not (m.tie_embeddings and first))))
    return StageParams(
        split=total,
        largest_layer=largest,
        attention_layers=moe_layers + dense_layers,
        moe_layers=moe_layers,
        dense_layers=dense_layers,
        first=first,
        last=last,
        mtp=bool(conv == "megatron" and last and m.mtp_depth and mtp),
        embedding=embedding_params(m, tp, padded_vocab(m, tp, conv, pad)),
        largest_tensor=_largest_tensor(m, tp, ep, etp, moe_layers, dense_layers, first or last),
    )


def _largest_tensor(
    m: ModelSpec, tp: int, ep: int, etp: int, moe_layers: int, dense_layers: int, edge: bool
) -> int:
    """The largest single parameter tensor: the embedding, a dense FFN matrix, an attention
    projection, or a MoE layer's routed experts fused into one [experts, 2*h_E, h] tensor
    (transformers 5.x ``gate_up_proj``)."""
    h = m.hidden
    sizes = [h * m.heads * (m.mla.v_head_dim if m.mla else m.head_dim) // tp]
    if edge:
        sizes.append(embedding_params(m, tp, m.vocab))
    if dense_layers:
        sizes.append(h * m.ffn // tp)
    if moe_layers and m.moe is not None:
        sizes.append(m.moe.n_routed // ep * 2 * m.moe.expert_ffn // etp * h)
    return max(sizes)
