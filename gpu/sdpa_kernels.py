"""One prepared GPU check (seconds): does CUDA pick the SDPA kernel dssup's traces assume? NOT YET RUN.

``dssup calibrate --kernels cuda`` (the default) sends every SDPA call of a trace to the kernel
``dssup.runtime.traced.cudasdpa.choose`` names from its reading of PyTorch's sdp_utils.cpp.
This script asks the GPU's own torch, for the same shapes as tests/unit/measure/test_cuda_sdpa.py,
which kernels it can use (``torch.backends.cuda.can_use_flash_attention`` /
``can_use_efficient_attention`` with ``SDPAParams``), runs each call under
``torch.nn.attention.sdpa_kernel`` restricted to the chosen backend with a backward, and prints
one line per shape: dssup's choice, torch's, and MATCH or DIFFER. Exit 1 on any DIFFER.

    python3 gpu/sdpa_kernels.py          # the GPU machine's python3, CUDA torch, dssup importable
"""

from __future__ import annotations

import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dssup.runtime.traced.cudasdpa import choose

SHAPES = [  # (q/k head dim, v head dim, dtype, kv heads, mask)
    (128, 128, torch.bfloat16, 8, False),
    (128, 128, torch.bfloat16, 2, False),
    (192, 128, torch.bfloat16, 8, False),
    (128, 128, torch.float32, 8, False),
    (128, 128, torch.bfloat16, 8, True),
    (192, 128, torch.bfloat16, 2, False),
    (100, 100, torch.float32, 8, False),
    (98, 98, torch.float32, 8, False),
]
BACKEND = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "math": SDPBackend.MATH}  # fmt: skip


def torch_choice(q, k, v, mask, gqa: bool) -> str:  # type: ignore[no-untyped-def]
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, mask is None, gqa)
    if torch.backends.cuda.can_use_flash_attention(params, False):
        return "flash"
    if torch.backends.cuda.can_use_efficient_attention(params, False):
        return "efficient"
    return "math"


def main() -> int:
    bad = 0
    for d_qk, d_v, dtype, kv, masked in SHAPES:
        mk = dict(device="cuda", dtype=dtype, requires_grad=True)
        q = torch.randn(2, 8, 512, d_qk, **mk)
        k = torch.randn(2, kv, 512, d_qk, **mk)
        v = torch.randn(2, kv, 512, d_v, **mk)
        mask = torch.ones(512, 512, dtype=torch.bool, device="cuda").tril() if masked else None
        ours, why = choose(q, k, v, mask)
        theirs = torch_choice(q, k, v, mask, kv != 8)
        with sdpa_kernel([BACKEND[theirs]]):
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=kv != 8
            )
            out.sum().backward()
        verdict = "MATCH" if ours == theirs else "DIFFER"
        bad += verdict == "DIFFER"
        print(
            f"{d_qk}/{d_v} {dtype} kv={kv} mask={masked}: dssup {ours} ({why}), torch {theirs}: {verdict}"
        )
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
