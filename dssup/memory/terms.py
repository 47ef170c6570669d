"""The vocabulary of activation terms: a term's name, group and bytes, the context every formula
reads, and which groups recomputation keeps (see ``activations.py`` for the formulas).

Bytes per element come from the configured precision: ``Ctx.act`` for tensors in the compute
dtype, ``Ctx.lin`` for linear-layer (and MoE SwiGLU) inputs that FP8 training caches at one
byte plus one FP32 scale per 1x128 tile (arXiv 2412.19437, section 3.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.config import Convention, Recompute
from dssup.memory.defaults import Resolved
from dssup.memory.profile import EagerProfile
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile

__all__ = [
    "FP8_TILE",
    "FULL_KEEP",
    "MODULE_GROUPS",
    "PAPER_SELECTIVE",
    "Ctx",
    "Term",
    "dropped",
    "keep",
    "term",
]

FULL_KEEP = frozenset({"input", "route", "io"})
PAPER_SELECTIVE = frozenset({"norm", "up_proj", "core_attn", "mlp_act", "moe_act", "shared_act"})
MODULE_GROUPS: dict[str, frozenset[str]] = {
    "core_attn": frozenset({"core_attn"}),
    "layernorm": frozenset({"norm"}),
    "mla_up_proj": frozenset({"up_proj"}),
    "mlp": frozenset({"mlp", "mlp_act"}),
    "moe": frozenset({"router", "experts", "moe_act", "shared", "shared_act"}),
    "moe_act": frozenset({"moe_act"}),
    "shared_experts": frozenset({"shared", "shared_act"}),
}
FP8_TILE = 1 + 4 / 128  # one FP8 byte plus an FP32 scale per 1x128 tile


@dataclass(frozen=True, slots=True)
class Term:
    name: str
    group: str
    bytes: int  # per sample (b = 1), rounded up to whole bytes


@dataclass(frozen=True, slots=True)
class Ctx:
    """Everything a term formula needs, resolved once per estimate."""

    m: ModelSpec
    conv: Convention
    t: int  # tensor parallel
    seq: int  # divisor of sequence-sharded (norm/dropout) regions: t with SP, else 1
    s: int  # local sequence length (s / cp)
    s_full: int  # keys attended to (s)
    flash: bool
    dropout: bool
    ep: int
    etp: int
    imbalance: float
    vocab: int
    profile: EagerProfile | TracedProfile | None = None  # trace-derived (replaces the terms)
    r: Resolved | None = None  # resolved precision and framework (None: convention defaults)

    @property
    def act(self) -> int:
        """Bytes per stored element of the compute dtype."""
        return 2 if self.r is None else self.r.precision.activations

    @property
    def lin(self) -> float:
        """Bytes per cached linear-layer input element (FP8 tiles when cached in FP8)."""
        return FP8_TILE if self.r is not None and self.r.precision.cache_fp8 else self.act

    @property
    def eager(self) -> bool:
        """Eager PyTorch modules (transformers, or a user model under DeepSpeed)."""
        return (
            self.conv == "megatron"
            and self.r is not None
            and self.r.framework in ("transformers", "deepspeed")
        )

    @property
    def deepseek(self) -> bool:
        """DeepSeek-V3's own code (``defaults.py``)."""
        return self.conv == "megatron" and self.r is not None and self.r.framework == "deepseek"


def term(name: str, group: str, value: float) -> Term:
    """A term with its per-sample bytes rounded up (so b * bytes never under-counts)."""
    return Term(name, group, math.ceil(value))


# DeepSeek recomputes every RMSNorm (q/kv norms too) and the SwiGLU of its shared experts.
_DEEPSEEK_EXTRA = {"layernorm": frozenset({"latent_norm"}), "moe_act": frozenset({"shared_act"})}


def dropped(c: Ctx | None) -> frozenset[str]:
    """Groups selective recompute drops under ``c``."""
    if c is None or c.conv == "paper" or c.r is None:
        return PAPER_SELECTIVE
    return _dropped(c.r.recompute_modules, c.deepseek)


@lru_cache(maxsize=64)
def _dropped(modules: frozenset[str], deepseek: bool) -> frozenset[str]:
    """The groups of ``modules`` (cached: ``keep`` asks for every term of every stage)."""
    out: frozenset[str] = frozenset()
    for module in modules:
        out |= MODULE_GROUPS[module]
        if deepseek:
            out |= _DEEPSEEK_EXTRA.get(module, frozenset())
    return out


def keep(group: str, recompute: Recompute, c: Ctx | None = None) -> bool:
    """Whether a term of ``group`` stays stored under ``recompute`` (selective: the modules of
    ``c``'s settings; the paper's fixed set without ``c``)."""
    if group.startswith("eager:"):  # eager profile terms are measured per recompute level
        return group[6:] == recompute
    if recompute == "full":
        return group in FULL_KEEP
    if recompute == "selective":
        return group not in dropped(c)
    return True
