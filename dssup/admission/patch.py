"""Write a new training config back into the job, in the places the job itself uses.

A knob is rewritten everywhere it is stated (annotation, Megatron flag, HF flag, literal env
var); a knob stated nowhere is added in the job's own style (Megatron flags, HF flags, or our
annotations). Knobs that live only in a DeepSpeed ConfigMap or a ConfigMap-backed env var cannot
be changed by an admission patch (that would be a side effect), so ``render`` returns None and
the policy tries the next candidate. The caller re-reads the patched object to prove the patch
says what it meant (see ``policy.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission import annotations as ann
from dssup.admission.argv import ArgvEditor
from dssup.admission.flags import ENV, HF, MEGATRON, SWITCHES
from dssup.admission.source import Sources
from dssup.admission.view import escape

__all__ = ["Change", "annotation_ops", "render"]

Change = dict[str, tuple[Any, Any]]  # knob -> (old, new)
_MEGATRON_ANY = frozenset().union(*MEGATRON.values(), *SWITCHES.values())
_MEGATRON_OWN = frozenset().union(
    *MEGATRON.values(), SWITCHES["sp"], SWITCHES["dist_opt"], SWITCHES["recompute_activations"]
)
_HF_ANY = frozenset().union(*HF.values())


def style(src: Sources) -> str:
    """``megatron``, ``hf`` or ``annotation``: how the job states its knobs."""
    if src.has(_MEGATRON_OWN):
        return "megatron"
    return "hf" if src.has(_HF_ANY) else "annotation"


class _Writer:
    def __init__(self, src: Sources) -> None:
        self.src = src
        self.editors = {c.args_path: ArgvEditor(c) for _, c in src.containers}
        self.annotations: dict[str, str] = {}
        self.env_ops: list[dict[str, Any]] = []
        self.style = style(src)

    def _styled(self, names: frozenset[str]) -> list[ArgvEditor]:
        return [
            e
            for e in self.editors.values()
            if any(e.container is c for _, c in self.src.containers) and _mentions(e, names)
        ]

    def set_flag(self, names: frozenset[str], value: str) -> bool:
        return any([e.set(names, value) for e in self.editors.values()])

    def append(self, group: frozenset[str], tokens: list[str]) -> bool:
        targets = self._styled(group)
        return bool(targets) and all(e.append(tokens) for e in targets)

    def set_env(self, knob: str, value: str) -> tuple[bool, bool]:
        """(found any, all writable)."""
        found, ok = False, True
        for _, c in self.src.containers:
            for var in c.env:
                if var.name in ENV.get(knob, ()):
                    found = True
                    if var.value is None or var.position < 0:
                        ok = False
                        continue
                    base = f"{c.env_path}/{var.position}"
                    self.env_ops += [
                        {"op": "test", "path": f"{base}/name", "value": var.name},
                        {"op": "replace", "path": f"{base}/value", "value": value},
                    ]
        return found, ok

    def set_knob(
        self, knob: str, ann_key: str | None, value: str, flag_sets: list[frozenset[str]]
    ) -> bool:
        """Rewrite every statement of a knob; False if one of them cannot be rewritten."""
        wrote = False
        if ann_key and ann_key in self.src.view.annotations:
            self.annotations[ann_key] = value
            wrote = True
        for names in flag_sets:
            wrote = self.set_flag(names, value) or wrote
        found, ok = self.set_env(knob, value)
        return ok and (wrote or found)


def _mentions(editor: ArgvEditor, names: frozenset[str]) -> bool:
    from dssup.admission.argv import find_lists

    return bool(find_lists(editor.lists, names))


def _micro(w: _Writer, new: int) -> bool:
    v = str(new)
    if w.set_knob("micro_batch", ann.MICRO_BATCH, v, [MEGATRON["micro_batch"], HF["micro_batch"]]):
        return True
    if w.style == "megatron":
        return w.append(_MEGATRON_ANY, ["--micro-batch-size", v])
    if w.style == "hf":
        return w.append(_HF_ANY, ["--per_device_train_batch_size", v])
    w.annotations[ann.MICRO_BATCH] = v
    return True


def _keep_global(w: _Writer, global_batch: int, stated: bool, accum: int) -> bool:
    """Make the global batch explicit (or the accumulation) so the new micro-batch keeps it."""
    if w.style == "hf" or w.src.has(HF["grad_accum"]):
        if w.set_knob("grad_accum", None, str(accum), [HF["grad_accum"]]):
            return True
        return w.append(_HF_ANY, ["--gradient_accumulation_steps", str(accum)])
    if stated:
        return True
    if w.style == "megatron":
        return w.append(_MEGATRON_ANY, ["--global-batch-size", str(global_batch)])
    w.annotations[ann.GLOBAL_BATCH] = str(global_batch)
    return True


def _recompute(w: _Writer, old: str, new: str) -> bool:
    if ann.RECOMPUTE in w.src.view.annotations:
        w.annotations[ann.RECOMPUTE] = new
    if w.style == "hf":
        if new == "selective":
            return False
        names = HF["recompute"]
        if new == "full":
            return w.set_flag(names, "true") or w.append(_HF_ANY, ["--gradient_checkpointing"])
        return all(e.remove(names) for e in w.editors.values())
    if w.style != "megatron":
        w.annotations[ann.RECOMPUTE] = new
        return True
    drop = MEGATRON["recompute"] | MEGATRON["recompute_method"] | MEGATRON["recompute_layers"]
    if not all(e.remove(drop | SWITCHES["recompute_activations"]) for e in w.editors.values()):
        return False
    if new == "none":
        return True
    tokens = ["--recompute-granularity", new]
    if new == "full":
        tokens += ["--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return w.append(_MEGATRON_ANY, tokens)


def _zero(w: _Writer, new: int) -> bool:
    if w.set_knob("zero_stage", ann.ZERO_STAGE, str(new), []):
        return True
    if w.style == "megatron" and new in (0, 1):
        names = SWITCHES["dist_opt"]
        if new == 1:
            return w.src.has(names) or w.append(_MEGATRON_ANY, ["--use-distributed-optimizer"])
        return all(e.remove(names) for e in w.editors.values())
    if w.style == "annotation":
        w.annotations[ann.ZERO_STAGE] = str(new)
        return True
    return False


def expressible(
    src: Sources, origins: Mapping[str, str], training: Any
) -> dict[str, tuple[Any, ...] | None]:
    """Values a resize may choose per knob (None = any), given how the job states its knobs."""
    kind = style(src)
    zero: tuple[int, ...] | None = None
    if origins.get("zero_stage") in {"deepspeed", "env-configmap"} or kind == "hf":
        zero = (training.zero_stage,)
    elif kind == "megatron" and origins.get("zero_stage") != "annotation":
        zero = (0, 1) if training.zero_stage in (0, 1) else (training.zero_stage,)
    recompute: tuple[str, ...] | None = ("none", "full") if kind == "hf" else None
    if origins.get("recompute") in {"deepspeed", "env-configmap"}:
        recompute = (training.recompute,)
    micro = None
    if {origins.get("micro_batch"), origins.get("grad_accum")} & {"deepspeed", "env-configmap"}:
        micro = (training.micro_batch,)
    return {"zero_stage": zero, "recompute": recompute, "micro_batch": micro}


def render(
    src: Sources,
    change: Change,
    global_batch: int,
    stated: bool,
    accum: int,
    *,
    pin_global: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, str]] | None:
    """(argument/env operations, annotation values) for ``change``, or None if inexpressible.

    ``accum`` is the new gradient accumulation; ``pin_global`` makes an implicit global batch
    explicit even when the micro-batch stays (needed when the data-parallel size changes).
    """
    w = _Writer(src)
    ok = True
    if "micro_batch" in change:
        ok = _micro(w, change["micro_batch"][1])
    if ok and ({"micro_batch", "grad_accum"} & set(change) or pin_global):
        ok = _keep_global(w, global_batch, stated, accum)
    if ok and "recompute" in change:
        ok = _recompute(w, *change["recompute"])
    if ok and "zero_stage" in change:
        ok = _zero(w, change["zero_stage"][1])
    if not ok:
        return None
    ops = [op for e in w.editors.values() for op in e.ops()] + w.env_ops
    return ops, w.annotations


def annotation_ops(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    """``add`` operations for annotations whose value differs (none when all equal)."""
    meta = obj.get("metadata")
    current = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(current, Mapping):
        return (
            [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
            if values
            else []
        )
    return [
        {"op": "add", "path": f"/metadata/annotations/{escape(k)}", "value": v}
        for k, v in values.items()
        if current.get(k) != v
    ]
