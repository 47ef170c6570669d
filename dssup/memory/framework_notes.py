"""The assumption lines of the ``megatron`` convention that depend on the training framework.

Each setting the user did not give is marked "(default)" with the flag that changes it, so a
reader sees which code's kernels, loss, optimizer and recompute produced the number.
"""

from __future__ import annotations

from dssup.memory.config import Training
from dssup.memory.defaults import Resolved
from dssup.memory.spec import ModelSpec

__all__ = ["framework_lines"]

_CODE = {
    "megatron": "Megatron-core with TransformerEngine kernels",
    "deepseek": "DeepSeek-V3's own code as arXiv 2412.19437 describes it (every RMSNorm, the "
    "MLA up-projections and the MoE SwiGLU recomputed; attention output kept once, E5M6)",
    "deepspeed": "DeepSpeed around an eager PyTorch (transformers) model",
    "transformers": "Hugging Face transformers eager modules (Trainer/accelerate)",
}


def _d(r: Resolved, name: str) -> str:
    flag = "--" + name.replace("_", "-")
    return f" (default; {flag} to change)" if name in r.defaulted else ""


def _recompute(t: Training, r: Resolved) -> str:
    if t.recompute == "none":
        return "recompute none: every activation stored"
    if r.framework in ("transformers", "deepspeed"):
        return (
            "recompute full: gradient checkpointing per decoder layer (its input kept); the "
            "layer is re-forwarded for its backward, once per device"
        )
    if t.recompute == "selective":
        mods = ",".join(sorted(r.recompute_modules)) or "none"
        return (
            f"recompute selective: Megatron --recompute-modules {mods}{_d(r, 'recompute_modules')}"
            "; one layer's recomputed modules re-created during its backward"
        )
    unit = r.recompute_num_layers
    given = "" if t.recompute_method or t.recompute_num_layers else " (default)"
    what = (
        f"the input of every {unit} layer(s) kept, one unit re-forwarded for its backward"
        if r.recompute_method == "uniform"
        else f"the first {unit} layer(s) of each stage keep only their input"
    )
    return (
        f"recompute full: --recompute-method {r.recompute_method}, {unit} layer(s){given}: {what}"
    )


def framework_lines(m: ModelSpec, t: Training, r: Resolved) -> list[str]:
    """What the framework setting decided, one line each."""
    p = r.precision
    fp8 = (
        "; linear-layer and MoE SwiGLU inputs cached in FP8 (1 B + an FP32 scale per 1x128 tile)"
        if p.cache_fp8
        else ""
    )
    loss = (
        "fused vocab-parallel cross-entropy: one FP32 b*s*v/t softmax kept, its backward adds "
        "the gradient cast to the compute dtype"
        if r.loss == "fused"
        else "unfused cross-entropy: FP32 log-softmax kept, its backward adds two FP32 b*s*v "
        "gradients"
    )
    attention = {
        "flash": "flash attention: only the FP32 log-sum-exp per query and head",
        "sdpa": "SDPA as CUDA runs it: the flash kernel when q/k/v head dims agree (16-bit), "
        "else the memory-efficient one (q/k head dim 192 with v 128 included, PyTorch's "
        "sdp_utils.cpp): only the FP32 log-sum-exp per query and head beside q, k, v and the "
        "output",
        "sdpa-cpu": "SDPA as the CPU runs it: its flash kernel when q/k/v head dims agree, else "
        "the math path with FP32 "
        "q, k, v copies and FP32 probabilities",
        "eager": "eager attention: probabilities stored (FP32 softmax, plus its copy in the "
        "compute dtype)",
    }[r.attention]
    temp = {
        "fused": "updates in place",
        "foreach": f"one moment-sized temporary ({p.moments} B per shard parameter)",
        "forloop": "per-tensor temporaries (twice the largest tensor)",
    }[r.optimizer]
    if p.gradients < 4 and p.master > 0:
        temp += "; the step works on an FP32 copy of the 16-bit gradients (4 B per parameter)"
    out = [
        f"framework {r.framework}{_d(r, 'framework')}: {_CODE[r.framework]}",
        f"activations stored in {p.activations} B per element{fp8}",
        f"loss: {loss}{_d(r, 'loss')}",
        f"attention kernel: {attention}{_d(r, 'attention')}",
        f"Adam {r.optimizer}{_d(r, 'optimizer')}: {temp}",
        _recompute(t, r),
    ]
    if m.mtp_depth:
        built = "built" if r.mtp else "not built (its parameters and activations excluded)"
        out.append(f"MTP modules {built}{_d(r, 'mtp')}")
    if r.framework == "transformers" and t.grad_accum == 1:
        out.append(
            "gradients freed between steps (zero_grad(set_to_none=True)): absent in forward, "
            "present at the optimizer step"
        )
    return out
