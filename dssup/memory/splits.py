"""The uneven pipeline splits the planner tries, each as Megatron-LM's flags state it.

Why: the first and last pipeline stages carry more than their layers. The first holds the
embedding and, under 1F1B, the most micro-batches in flight; the last holds the head, the FP32
logits of the loss and the MTP modules. An even split overloads them, so people who run these
recipes move layers off the ends: DeepSeek-V3 on 16 DualPipe stages as 3, 4 x 14, 2 (NVIDIA's
layout of that stack), Llama-3.1-405B on 64 virtual stages as 1, 2 x 62, 1. A planner that
only splits evenly reports such a layout as not fitting, so it tries these splits itself and
prints the one it chose. The family is what Megatron-LM's own options express
(``megatron/core/transformer/transformer_block.py``, ``get_num_layers_to_build``, and
``transformer_layer.py``, ``get_transformer_layer_offset``, at NVIDIA/Megatron-LM d98e8a6):

* even: dssup's default (``stages.partition``): ceil(l/n) layers per stage, the rest last;
* ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
  the embedding and the loss each count as one layer, the (virtual) stages split the total
  evenly, and the first (last) virtual stage builds one layer fewer. The MTP modules count as
  one layer each with the loss, as ``--pipeline-model-parallel-layout`` places them (the
  Megatron-Bridge DeepSeek-V3 recipe's ``Et|(tt|)*30mL``);
* ``--decoder-first-pipeline-num-layers F --decoder-last-pipeline-num-layers L``: F layers on
  the first rank, L on the last, the rest evenly over the middle ranks (which Megatron asserts
  divides). Tried with the ends lighter than a middle stage by at most two layers (they carry
  the extra load; a heavier end is never the better split), one chunk per rank (1F1B, DualPipe).

Pure: counts only; which split wins is the planner's (``plan.py``) or the estimate's choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.config import Schedule
from dssup.memory.spec import ModelSpec

__all__ = ["StageSplit", "describe_split", "split_family", "split_vpps"]


@dataclass(frozen=True, slots=True)
class StageSplit:
    """One way to spread the layers: the counts per (virtual) stage and the flags that say it."""

    counts: tuple[int, ...] | None  # None: dssup's even split
    how: str


def describe_split(counts: tuple[int, ...]) -> str:
    """``3,4x14,2``: runs of equal counts written once with their length."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}x{j - i}" if j - i > 2 else ",".join([str(counts[i])] * (j - i)))
        i = j
    return ",".join(out)


def split_family(
    m: ModelSpec, pp: int, vpp: int, schedule: Schedule, mtp: bool
) -> tuple[StageSplit, ...]:
    """The splits to try for ``pp`` ranks of ``vpp`` chunks, even first, no duplicates; an
    interleaved even split that does not divide the layers is left out (``validate``)."""
    return _family(m.layers, m.mtp_depth if mtp else 0, pp, vpp, schedule == "interleaved")


def split_vpps(m: ModelSpec, pp: int, limit: int, mtp: bool) -> list[int]:
    """Virtual stages per rank (>= 2) that the even split or an account-for split makes whole."""
    if pp == 1:
        return []
    return [
        v for v in range(2, limit + 1) if _family(m.layers, m.mtp_depth if mtp else 0, pp, v, True)
    ]


@lru_cache(maxsize=4096)
def _family(layers: int, mtp: int, pp: int, vpp: int, interleaved: bool) -> tuple[StageSplit, ...]:
    stages = pp * vpp
    out: dict[tuple[int, ...] | None, str] = {}
    if stages == 1:
        return (StageSplit(None, "one stage"),)
    if not interleaved or layers % stages == 0:
        out[None] = "even (dssup's default)"
    seen: set[tuple[int, ...]] = set()
    for counts, how in (*_account_for(layers, mtp, stages), *_first_last(layers, pp, vpp)):
        if counts in seen or counts == _even(layers, stages):
            continue
        seen.add(counts)
        out[counts] = how
    return tuple(StageSplit(c, h) for c, h in out.items())


def _even(layers: int, stages: int) -> tuple[int, ...]:
    """The counts dssup's even split gives (``stages.partition``), to drop its duplicates."""
    per = -(-layers // stages)
    if per * (stages - 1) < layers:
        return (per,) * (stages - 1) + (layers - per * (stages - 1),)
    q, r = divmod(layers, stages)
    return tuple(q + 1 if i < r else q for i in range(stages))


_EMB = "--account-for-embedding-in-pipeline-split"
_LOSS = "--account-for-loss-in-pipeline-split"


def _account_for(layers: int, mtp: int, stages: int) -> list[tuple[tuple[int, ...], str]]:
    """Embedding, loss (and MTP with the loss) counted as layers, when the total divides."""
    out = []
    variants = [(1, 0, _EMB), (0, 1, _LOSS), (1, 1, f"{_EMB} {_LOSS}")]
    if mtp:
        note = f" (and the {mtp} MTP module{'s' if mtp > 1 else ''} as layers)"
        variants += [(0, 1 + mtp, _LOSS + note), (1, 1 + mtp, f"{_EMB} {_LOSS}{note}")]
    for emb, tail, how in variants:
        total = layers + emb + tail
        if total % stages:
            continue
        per = total // stages
        if per < emb or per < tail:
            continue
        counts = [per] * stages
        counts[0] -= emb
        counts[-1] -= tail
        out.append((tuple(counts), how))
    return out


def _first_last(layers: int, pp: int, vpp: int) -> list[tuple[tuple[int, ...], str]]:
    """Megatron's first/last-rank layer counts, ends lighter than the middle by 0-2 layers."""
    if vpp != 1 or pp < 3:
        return []
    out = []
    middle = pp - 2
    for k in range(1, layers // middle + 1):
        rest = layers - k * middle
        for first in range(max(0, k - 2), k + 1):
            last = rest - first
            if max(0, k - 2) <= last <= k and (first, last) != (k, k):
                counts = (first, *(k,) * middle, last)
                how = (
                    f"--decoder-first-pipeline-num-layers {first} "
                    f"--decoder-last-pipeline-num-layers {last}"
                )
                out.append((counts, how))
    return out
