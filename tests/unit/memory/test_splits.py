"""The uneven pipeline splits the planner tries (``splits.py``), as Megatron-LM's own options
give them: the published splits of the validation recipes are among them."""

from __future__ import annotations

import pytest

from dssup.memory import preset
from dssup.memory.splits import describe_split, split_family, split_vpps
from dssup.modelio import load_model


def _counts(model: str, pp: int, vpp: int, schedule: str) -> list[tuple[int, ...] | None]:
    m = preset(model) if "/" not in model else load_model(model)
    return [s.counts for s in split_family(m, pp, vpp, schedule, True)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "pp", "vpp", "schedule", "split"),
    [
        # NVIDIA's PP16 layout of a DeepSeek-V3 stack (the DualPipe recipe's split)
        ("deepseek-v3", 16, 1, "dualpipe", (3, *(4,) * 14, 2)),
        # Megatron-Bridge's DeepSeek-V3 layout Et|(tt|)*30mL: embedding and 1 layer, MTP + loss
        ("deepseek-v3", 8, 4, "interleaved", (1, *(2,) * 30, 0)),
        # Llama-3.1-405B, account for embedding and loss over 64 virtual stages
        ("meta-llama/Llama-3.1-405B", 8, 8, "interleaved", (1, *(2,) * 62, 1)),
        # Qwen3-235B-A22B: 94 layers + embedding + loss over 32 virtual stages
        ("Qwen/Qwen3-235B-A22B", 8, 4, "interleaved", (2, *(3,) * 30, 2)),
    ],
)
def test_the_published_splits_are_in_the_family(
    model: str, pp: int, vpp: int, schedule: str, split: tuple[int, ...]
) -> None:
    assert split in _counts(model, pp, vpp, schedule)


def test_every_split_places_every_layer_once_and_even_comes_first() -> None:
    v3 = preset("deepseek-v3")
    for pp in (2, 4, 8, 16, 32):
        fam = split_family(v3, pp, 1, "1f1b", True)
        assert fam[0].counts is None  # dssup's even split, tried first
        seen = set()
        for s in fam[1:]:
            assert s.counts is not None and sum(s.counts) == v3.layers and len(s.counts) == pp
            assert min(s.counts) >= 0 and s.counts not in seen and "--" in s.how
            seen.add(s.counts)


def test_first_last_counts_are_megatrons_decoder_first_last_layers() -> None:
    """--decoder-first/last-pipeline-num-layers F L: the middle ranks share the rest evenly;
    tried with the ends at most two layers lighter than a middle stage."""
    fam = split_family(preset("deepseek-v3"), 16, 1, "1f1b", True)
    first_last = [s for s in fam if "--decoder-first" in s.how]
    assert first_last and all(len(set(s.counts[1:-1])) == 1 for s in first_last if s.counts)
    assert (2, *(4,) * 14, 3) in [s.counts for s in first_last]


def test_interleaving_that_only_an_uneven_split_makes_whole() -> None:
    """61 layers (DeepSeek-V3) divide no PP x VPP: only the account-for splits interleave."""
    v3 = preset("deepseek-v3")
    assert split_vpps(v3, 8, 32, True) == [2, 4]
    assert all(s.counts is not None for s in split_family(v3, 8, 4, "interleaved", True))
    assert split_vpps(v3, 8, 32, False) == []  # without MTP: 61 + 2 = 63, not whole


def test_describe_split() -> None:
    assert describe_split((3, *(4,) * 14, 2)) == "3,4x14,2"
    assert describe_split((4, 4, 1)) == "4,4,1"
