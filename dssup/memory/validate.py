"""Checks that need both the model and the layout, with messages that name the fix.

Pydantic validates each object alone (no negative sizes); whether TP divides the heads or EP
divides the experts depends on the pair, so it lives here and runs before every estimate.
"""

from __future__ import annotations

from functools import lru_cache

from dssup.errors import ConfigError
from dssup.memory.config import Layout, Training, check_schedule
from dssup.memory.defaults import Resolved
from dssup.memory.schedule import check_micro_batches
from dssup.memory.spec import ModelSpec

__all__ = ["check_split", "divisors", "validate"]


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Positive divisors of ``n`` (up to ``limit``), ascending (a fresh list)."""
    every = _divisors(n)
    if limit is None or limit >= n:
        return list(every)
    return [d for d in every if d <= limit]


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _suggest(n: int, limit: int = 64) -> str:
    return ", ".join(str(d) for d in divisors(n, min(n, limit))[:8])


def _check_tp(m: ModelSpec, layout: Layout) -> None:
    tp = layout.tp
    if m.heads % tp:
        raise ConfigError(
            "tp",
            f"{tp} does not divide num_attention_heads={m.heads}",
            f"use a divisor such as {_suggest(m.heads)}",
        )
    if m.mla is None and m.kv_heads % tp:
        raise ConfigError(
            "tp",
            f"{tp} does not divide num_key_value_heads={m.kv_heads}",
            f"use a divisor such as {_suggest(m.kv_heads)}",
        )
    if m.ffn % tp:
        raise ConfigError(
            "tp",
            f"{tp} does not divide intermediate_size={m.ffn}",
            f"use a divisor such as {_suggest(m.ffn)}",
        )


def _check_experts(m: ModelSpec, layout: Layout) -> None:
    if m.moe is None:
        if layout.ep > 1 or layout.etp > 1:
            raise ConfigError("ep", f"model {m.name} has no experts", "use --ep 1 --etp 1")
        return
    if m.moe.n_routed % layout.ep:
        raise ConfigError(
            "ep",
            f"{layout.ep} does not divide n_routed_experts={m.moe.n_routed}",
            f"use a divisor such as {_suggest(m.moe.n_routed)}",
        )
    if m.moe.expert_ffn % layout.etp:
        raise ConfigError(
            "etp",
            f"{layout.etp} does not divide moe_intermediate_size={m.moe.expert_ffn}",
            f"use a divisor such as {_suggest(m.moe.expert_ffn)}",
        )


def _check_groups(layout: Layout) -> None:
    group = layout.ep * layout.etp
    if (layout.tp * layout.cp * layout.dp) % group:
        raise ConfigError(
            "ep",
            f"ep*etp={group} does not divide tp*cp*dp={layout.tp * layout.cp * layout.dp}",
            "choose ep and etp whose product divides the tensor-, context- and data-parallel GPUs",
        )


def _check_pp(m: ModelSpec, layout: Layout) -> None:
    if layout.stages > m.layers:
        raise ConfigError(
            "pp",
            f"{layout.stages} stages for {m.layers} layers",
            f"use at most {m.layers} pipeline stages (pp*vpp with interleaving)",
        )
    split = layout.layers_per_stage
    check_split(m, split)
    if layout.vpp > 1 and split is None and m.layers % (layout.pp * layout.vpp):
        raise ConfigError(
            "vpp",
            f"pp*vpp={layout.pp * layout.vpp} does not divide {m.layers} layers",
            "choose vpp so that every virtual stage has the same number of layers",
        )


def _check_pipeline(m: ModelSpec, layout: Layout, training: Training, accumulation: bool) -> None:
    check_schedule(layout)
    if layout.schedule == "dualpipe" and m.moe is None:
        raise ConfigError(
            "schedule",
            f"DualPipe keeps two stages' parameters on every rank; {m.name} is dense, where "
            "that doubles its states for nothing (DeepSeek-V3 pairs it with EP64)",
            "use --schedule 1f1b or interleaved for a dense model",
        )
    if accumulation:
        check_micro_batches(layout, training.grad_accum)


_MODULE_NEEDS = {
    "mla_up_proj": ("multi-head latent attention", lambda m: m.mla is not None),
    "moe": ("MoE layers", lambda m: m.moe is not None),
    "moe_act": ("MoE layers", lambda m: m.moe is not None),
    "shared_experts": ("shared experts", lambda m: m.moe is not None and m.moe.n_shared > 0),
    "mlp": ("dense MLP layers", lambda m: m.moe_layer_count < m.layers),
}


def _check_recompute(m: ModelSpec, t: Training, r: Resolved | None, planning: bool) -> None:
    if t.recompute_modules is not None and t.recompute != "selective" and not planning:
        raise ConfigError(
            "recompute_modules", "only selective recompute reads it", "add --recompute selective"
        )
    for name in ("recompute_method", "recompute_num_layers"):
        if getattr(t, name) is not None and t.recompute != "full" and not planning:
            raise ConfigError(name, "only full recompute reads it", "add --recompute full")
    for module in t.recompute_modules or ():
        what, has = _MODULE_NEEDS.get(module, ("", lambda _m: True))
        if not has(m):
            raise ConfigError(
                "recompute_modules",
                f"{module} recomputes {what}, which {m.name} does not have",
                "drop it from --recompute-modules",
            )
    if r is None or r.framework in ("megatron", "deepseek"):
        return
    if t.recompute == "selective" or t.recompute_method or t.recompute_num_layers:
        raise ConfigError(
            "recompute",
            f"{r.framework} checkpoints whole decoder layers (gradient_checkpointing_enable); "
            "it has no selective recompute, method or unit size",
            "use --recompute full or none",
        )


def _check_framework(m: ModelSpec, layout: Layout, t: Training, r: Resolved) -> None:
    if t.mtp and not m.mtp_depth:
        raise ConfigError("mtp", f"{m.name} has no MTP modules", "drop --mtp")
    if r.framework in ("megatron", "deepseek"):
        if r.attention in ("sdpa", "sdpa-cpu"):
            raise ConfigError(
                "attention",
                "Megatron has no PyTorch-SDPA backend (flash/fused or unfused)",
                "use --attention flash or eager",
            )
        return
    if r.precision.cache_fp8:
        raise ConfigError(
            "dtypes",
            f"FP8 activation caching is modelled for megatron (TransformerEngine), not "
            f"{r.framework}",
            "drop activations=fp8 / --precision fp8, or use --framework megatron",
        )
    if r.framework == "transformers" and layout.pp > 1:
        raise ConfigError(
            "pp",
            "transformers (Trainer, accelerate) trains without pipeline parallelism",
            "use --pp 1, or --framework deepspeed/megatron",
        )


def check_split(m: ModelSpec, split: tuple[int, ...] | None) -> None:
    """A given layer split must place every layer of the model."""
    if split is not None and sum(split) != m.layers:
        raise ConfigError(
            "layers_per_stage",
            f"sums to {sum(split)}, the model has {m.layers} layers",
            "make the per-stage counts add up to the number of layers",
        )


def validate(
    m: ModelSpec,
    layout: Layout,
    training: Training,
    r: Resolved | None = None,
    accumulation: bool = True,
) -> None:
    """Raise ``ConfigError`` for the first inconsistency between model, layout and training
    (and, given the resolved settings ``r``, the framework). ``accumulation=False`` is the
    planner's: it skips the checks of what it varies itself (``grad_accum`` against the
    schedule, the recompute level the recompute settings belong to)."""
    _check_tp(m, layout)
    _check_experts(m, layout)
    _check_groups(layout)
    _check_pp(m, layout)
    if training.seq_len % layout.cp:
        raise ConfigError(
            "cp",
            f"{layout.cp} does not divide seq_len={training.seq_len}",
            "use a context-parallel size that divides the sequence length",
        )
    if layout.sp and layout.tp > 1 and training.seq_len // layout.cp % layout.tp:
        raise ConfigError(
            "seq_len",
            f"{training.seq_len} is not divisible by tp*cp with sequence parallelism",
            "use a multiple of tp*cp or pass --no-sp",
        )
    _check_pipeline(m, layout, training, accumulation)
    _check_recompute(m, training, r, planning=not accumulation)
    if r is not None:
        _check_framework(m, layout, training, r)
