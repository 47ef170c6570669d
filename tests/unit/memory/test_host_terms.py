"""The host bytes of an estimate come with their terms, and the terms are the whole of them."""

from __future__ import annotations

import itertools

import pytest

from dssup.memory import Layout, Training, estimate, preset
from dssup.memory.offload import HOST_TERMS

CASES = [  # parameter offload is ZeRO-3 only (the model refuses it otherwise)
    (conv, zero, (opt, par), accum)
    for conv, zero, (opt, par), accum in itertools.product(
        ["megatron", "paper"],
        [1, 2, 3],
        [(True, False), (False, True), (True, True), (False, False)],
        [1, 4],
    )
    if zero == 3 or not par
]


@pytest.mark.parametrize(("convention", "zero", "offload", "accum"), CASES)
def test_host_terms_sum_to_the_host_bytes(
    convention: str, zero: int, offload: tuple[bool, bool], accum: int
) -> None:
    opt, par = offload
    t = Training(
        micro_batch=1, seq_len=1024, grad_accum=accum, zero_stage=zero,
        offload_optimizer=opt, offload_params=par, recompute="full",
    )  # fmt: skip
    est = estimate(preset("llama-3-8b"), Layout(dp=8), t, convention=convention)  # type: ignore[arg-type]
    for st in est.stages:
        assert sum(st.host_terms.values()) == st.host_bytes
        assert set(st.host_terms) <= set(HOST_TERMS)
        assert all(v > 0 for v in st.host_terms.values())
        assert (st.host_bytes > 0) == (opt or par)
