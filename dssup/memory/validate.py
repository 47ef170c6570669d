"""Checks that need both the model and the layout, with messages that name the fix.

Pydantic validates each object alone (no negative sizes); whether TP divides the heads or EP
divides the experts depends on the pair, so it lives here and runs before every estimate.
"""

from __future__ import annotations

from dssup.errors import ConfigError
from dssup.memory.config import Layout, Training
from dssup.memory.spec import ModelSpec

__all__ = ["divisors", "validate"]


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Positive divisors of ``n`` (up to ``limit``), ascending."""
    out = [d for d in range(1, (limit or n) + 1) if n % d == 0]
    return out


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
    if layout.pp > m.layers:
        raise ConfigError(
            "pp",
            f"{layout.pp} stages for {m.layers} layers",
            f"use at most {m.layers} pipeline stages",
        )
    split = layout.layers_per_stage
    if split is not None and sum(split) != m.layers:
        raise ConfigError(
            "layers_per_stage",
            f"sums to {sum(split)}, the model has {m.layers} layers",
            "make the per-stage counts add up to the number of layers",
        )
    if layout.vpp > 1 and m.layers % (layout.pp * layout.vpp):
        raise ConfigError(
            "vpp",
            f"pp*vpp={layout.pp * layout.vpp} does not divide {m.layers} layers",
            "choose vpp so that every virtual stage has the same number of layers",
        )


def validate(m: ModelSpec, layout: Layout, training: Training) -> None:
    """Raise ``ConfigError`` for the first inconsistency between model, layout and training."""
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
