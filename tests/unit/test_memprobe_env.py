"""The capped workers' heap settings pin glibc.malloc.* and keep the caller's other tunables."""

from __future__ import annotations

from tests.memprobe import HEAP, MALLOC, tunables


def test_malloc_tunables_are_ours_and_the_callers_others_stay():
    caller = "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.top_pad=67108864:glibc.pthread.rseq=0"
    assert tunables({"top_pad": 131072}, caller) == (
        "glibc.cpu.hwcaps=-AVX512F:glibc.pthread.rseq=0:glibc.malloc.top_pad=131072"
    )
    assert tunables({"top_pad": 131072}, "") == "glibc.malloc.top_pad=131072"
    assert "glibc.malloc.top_pad=131072" in HEAP["GLIBC_TUNABLES"]
    assert MALLOC["GLIBC_TUNABLES"].endswith("glibc.malloc.arena_max=1")
    assert HEAP["MALLOC_TOP_PAD_"] == "131072"
