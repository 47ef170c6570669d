"""What each convention and framework assumes when the user does not say.

``paper`` reproduces arXiv 2502.07846: 14 bytes per parameter (BF16 Adam moments), softmax
scores stored (no fused attention), dropout masks, no overheads. ``megatron`` is what real
training code holds; which code is the ``framework`` setting, and it decides the defaults that
differ between implementations:

============  =========  =====  ==========  ===============  ===================================
framework     loss       MTP    attention   Adam             selective recompute
============  =========  =====  ==========  ===============  ===================================
megatron      fused      built  flash       fused (no temp)  core_attn (Megatron's own default)
deepseek      fused      built  flash       fused (no temp)  layernorm, mla_up_proj, moe_act
deepspeed     unfused    no     sdpa        fused (no temp)  none: per-layer checkpoints
transformers  unfused    no     sdpa        foreach          none: per-layer checkpoints
============  =========  =====  ==========  ===============  ===================================

``deepseek`` is DeepSeek-V3's own training code as arXiv 2412.19437 describes it: it recomputes
every RMSNorm and the MLA up-projections (section 3.2.3), caches the MoE SwiGLU inputs in FP8 and
recomputes its output (section 3.3.4), and keeps the attention output once, in E5M6, for both
the output projection and the attention backward.

Sources: Megatron-core ``TransformerConfig`` (``recompute_modules`` default ``["core_attn"]``;
``vocab_parallel_cross_entropy``; TE/Apex ``FusedAdam`` updates in place); transformers 5.x
``ForCausalLMLoss`` (``logits.float()`` then ``cross_entropy``), ``attn_implementation``
default ``sdpa``, ``gradient_checkpointing_enable`` (one checkpoint per decoder layer), no MTP
module in ``DeepseekV3ForCausalLM``; torch ``AdamW`` (foreach on CUDA by default); DeepSpeed's
``FusedAdam`` when the config asks for Adam. Every default is printed as an assumption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dssup.errors import ConfigError
from dssup.memory.config import (
    Attention,
    Convention,
    Framework,
    GiB,
    Loss,
    OptimizerImpl,
    Overheads,
    Precision,
    RecomputeMethod,
    Training,
)

__all__ = ["Resolved", "default_precision", "resolve", "step_temporary"]


@dataclass(frozen=True, slots=True)
class Resolved:
    """Training and overhead settings with every ``None`` replaced by its default."""

    precision: Precision
    flash: bool
    dropout: bool
    comm_buffer_bytes: int
    fragmentation: float
    cuda_context_bytes: int
    optimizer_transient_per_param: int
    framework: Framework = "megatron"
    loss: Loss = "fused"
    mtp: bool = True
    attention: Attention = "flash"
    optimizer: OptimizerImpl = "fused"
    recompute_modules: frozenset[str] = frozenset({"core_attn"})
    recompute_method: RecomputeMethod = "uniform"
    recompute_num_layers: int = 1
    defaulted: tuple[str, ...] = field(default=())  # settings taken from defaults


_PAPER = Resolved(
    Precision(moments=2), False, True, 0, 0.0, 0, 0, mtp=False, attention="eager", optimizer="fused"
)
_MEGATRON = Resolved(Precision(), True, False, 1 * GiB, 0.10, 3 * GiB // 4, 0)
_FRAMEWORK: dict[Framework, tuple[Loss, bool, Attention, OptimizerImpl, frozenset[str]]] = {
    "megatron": ("fused", True, "flash", "fused", frozenset({"core_attn"})),
    "deepseek": (
        "fused",
        True,
        "flash",
        "fused",
        frozenset({"layernorm", "mla_up_proj", "moe_act"}),
    ),
    "deepspeed": ("unfused", False, "sdpa", "fused", frozenset()),
    "transformers": ("unfused", False, "sdpa", "foreach", frozenset()),
}


def default_precision(convention: Convention) -> Precision:
    """Bytes per state when the user names none (paper: BF16 Adam moments; megatron: ``bf16``),
    the base that per-state overrides (``--dtypes``) apply to."""
    return (_PAPER if convention == "paper" else _MEGATRON).precision


def resolve(convention: Convention, training: Training, overheads: Overheads) -> Resolved:
    """Fill the unset knobs of ``training`` and ``overheads`` from ``convention`` and
    ``training.framework``."""
    base = _PAPER if convention == "paper" else _MEGATRON
    prec = training.precision or base.precision
    common = {
        "precision": prec,
        "dropout": base.dropout if training.dropout is None else training.dropout,
        "comm_buffer_bytes": _pick(overheads.comm_buffer_bytes, base.comm_buffer_bytes),
        "fragmentation": _pick(overheads.fragmentation, base.fragmentation),
        "cuda_context_bytes": _pick(overheads.cuda_context_bytes, base.cuda_context_bytes),
    }
    if convention == "paper":
        _paper_only(training)
        if prec.cache_fp8:
            raise ConfigError(
                "dtypes",
                "the paper convention stores BF16 activations; FP8 caching would change nothing",
                "drop activations=fp8 / --precision fp8, or use --convention megatron",
            )
        flash = base.flash if training.flash_attention is None else training.flash_attention
        return Resolved(
            flash=flash,
            optimizer_transient_per_param=0,
            mtp=False,
            attention="flash" if flash else "eager",
            **common,  # type: ignore[arg-type]
        )
    fw: Framework = training.framework or "megatron"
    loss, mtp, attention, opt, modules = _FRAMEWORK[fw]
    defaulted = [
        name for name in ("framework", "loss", "mtp", "optimizer") if _unset(training, name)
    ]
    attn = _attention(training, attention)
    if training.attention is None and training.flash_attention is None:
        defaulted.append("attention")
    if training.recompute == "selective" and training.recompute_modules is None:
        defaulted.append("recompute_modules")
    impl = training.optimizer or opt
    return Resolved(
        flash=attn == "flash",
        optimizer_transient_per_param=step_temporary(prec, impl),
        framework=fw,
        loss=training.loss or loss,
        mtp=mtp if training.mtp is None else training.mtp,
        attention=attn,
        optimizer=impl,
        recompute_modules=modules
        if training.recompute_modules is None
        else frozenset(training.recompute_modules),
        recompute_method=training.recompute_method or "uniform",
        recompute_num_layers=training.recompute_num_layers or 1,
        defaulted=tuple(defaulted),
        **common,  # type: ignore[arg-type]
    )


def step_temporary(prec: Precision, impl: OptimizerImpl) -> int:
    """Bytes per stepped parameter the optimizer step allocates: the FP32 copy of 16-bit
    gradients that mixed precision steps on (DeepSpeed's ``single_partition_of_fp32_groups``
    grads, one ZeRO-3 sub-group at a time; Megatron's ``_copy_model_grads_to_main_grads`` with
    BF16 gradient buffers), plus foreach Adam's one moment-sized list (``torch._foreach_sqrt``
    of the second moments, in their dtype). Fused Adam updates in place."""
    copy = 4 if (prec.gradients < 4 and prec.master > 0) else 0
    return copy + (prec.moments if impl == "foreach" else 0)


def _pick(value: int | float | None, default: int | float) -> int | float:
    return default if value is None else value


def _unset(training: Training, name: str) -> bool:
    return getattr(training, name) is None


def _attention(training: Training, default: Attention) -> Attention:
    if training.attention is not None:
        if training.flash_attention is not None and (training.attention == "flash") != (
            training.flash_attention
        ):
            raise ConfigError(
                "attention",
                f"{training.attention} contradicts flash_attention={training.flash_attention}",
                "give one of --attention and --flash-attn/--no-flash-attn",
            )
        return training.attention
    if training.flash_attention is None:
        return default
    return "flash" if training.flash_attention else "eager"


def _paper_only(training: Training) -> None:
    """The paper convention has its own fixed choices; framework knobs would be ignored."""
    names = ("framework", "loss", "mtp", "attention", "optimizer", "recompute_modules")
    for name in (*names, "recompute_method", "recompute_num_layers"):
        if getattr(training, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                name,
                "the paper convention fixes this (arXiv 2502.07846's own choices)",
                f"drop {flag} or use --convention megatron",
            )
