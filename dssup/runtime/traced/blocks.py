"""Find the repeated decoder blocks of a model and tell their kinds apart, from the module tree.

The decoder stack is the ``nn.ModuleList`` holding the most parameters whose entries are all
of one class (transformers' ``model.layers``; the ``blocks`` or ``layers`` list of in-house
code). A block is ``moe`` when it holds routed experts -- a parameter of three or more
dimensions (fused expert weights, as transformers 5 stores them) or a list of at least two
identical sub-modules with weights (one module per expert) -- and ``dense`` otherwise. Dense
blocks in front of the first MoE block are the "first k dense" layers. Modules whose name says
``mtp`` or ``nextn`` outside the stack are reported as multi-token-prediction modules.

Blocks of one kind must have identical parameter shapes (one profile coefficient describes all
of them); a stack that mixes more shapes is refused with the first two that differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from dssup.errors import ConfigError

__all__ = ["Stack", "block_kind", "find_stack"]


def _signature(block: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((n, tuple(p.shape)) for n, p in block.named_parameters())


def _is_expert_list(mod: nn.Module) -> bool:
    if not isinstance(mod, nn.ModuleList) or len(mod) < 2:
        return False
    first = mod[0]
    return any(True for _ in first.parameters()) and all(
        type(m) is type(first) and _signature(m) == _signature(first) for m in mod
    )


def block_kind(block: nn.Module) -> str:
    """``moe`` if ``block`` holds routed experts, else ``dense``."""
    if any(p.dim() >= 3 for p in block.parameters()):
        return "moe"
    return "moe" if any(_is_expert_list(m) for m in block.modules()) else "dense"


def _numel(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


@dataclass
class Stack:
    """The decoder stack: where it sits, its blocks, their kinds, MTP modules found."""

    path: str  # dotted name of the ModuleList in the model
    blocks: list[nn.Module]
    kinds: list[str]
    mtp: list[str] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # original index of each block

    def counts(self) -> dict[str, int]:
        """Blocks per kind."""
        out: dict[str, int] = {}
        for k in self.kinds:
            out[k] = out.get(k, 0) + 1
        return out

    def first_dense(self) -> int:
        """Dense blocks in front of the first MoE block (all of them in a dense model)."""
        n = 0
        for k in self.kinds:
            if k != "dense":
                break
            n += 1
        return n

    def describe(self) -> str:
        """One line: what was found, e.g. '3 dense (first-k dense) + 58 moe blocks in
        model.layers; no MTP module'."""
        c = self.counts()
        parts = []
        if "dense" in c:
            tag = " (first-k dense)" if "moe" in c and self.first_dense() == c["dense"] else ""
            parts.append(f"{c['dense']} dense{tag}")
        if "moe" in c:
            parts.append(f"{c['moe']} moe")
        mtp = f"MTP modules: {', '.join(self.mtp)}" if self.mtp else "no MTP module"
        return f"{' + '.join(parts)} blocks in {self.path}; {mtp}"

    def keep(self, model: nn.Module, indices: tuple[int, ...]) -> Stack:
        """Replace the stack in ``model`` by the blocks at ``indices`` (a reduced model)."""
        if not indices or any(i < 0 or i >= len(self.blocks) for i in indices):
            raise ConfigError("blocks", f"cannot keep {indices} of {len(self.blocks)}", "")
        parent_path, _, name = self.path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        kept = [self.blocks[i] for i in indices]
        setattr(parent, name, nn.ModuleList(kept))
        return Stack(
            self.path,
            kept,
            [self.kinds[i] for i in indices],
            self.mtp,
            [self.indices[i] if self.indices else i for i in indices],
        )


def _check_shapes(path: str, blocks: list[nn.Module], kinds: list[str]) -> None:
    first: dict[str, int] = {}
    for i, (b, k) in enumerate(zip(blocks, kinds, strict=True)):
        j = first.setdefault(k, i)
        if _signature(b) != _signature(blocks[j]):
            raise ConfigError(
                "model",
                f"{path}[{j}] and {path}[{i}] are both {k} blocks with different parameter "
                "shapes; one profile coefficient cannot describe both",
                "calibrate models whose blocks of one kind are alike (or split the model)",
            )


def find_stack(model: nn.Module) -> Stack:
    """The decoder stack of ``model`` (see the module docstring)."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or not len(mod) or not name:
            continue
        if any(type(m) is not type(mod[0]) for m in mod):
            continue
        size = _numel(mod)
        if size and (best is None or size > best[0]):
            best = (size, name, mod)
    if best is None:
        raise ConfigError(
            "model",
            f"{type(model).__name__} has no list of repeated blocks (nn.ModuleList)",
            "keep the decoder layers in an nn.ModuleList",
        )
    _size, path, stack = best
    blocks = list(stack)
    kinds = [block_kind(b) for b in blocks]
    _check_shapes(path, blocks, kinds)
    mtp = [
        n
        for n, m in model.named_modules()
        if n
        and not n.startswith(path)
        and n.rsplit(".", 1)[-1].lower().startswith(("mtp", "nextn"))
        and _numel(m)
    ]
    return Stack(path, blocks, kinds, mtp, list(range(len(blocks))))
