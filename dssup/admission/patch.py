"""Write a new training config back into the job, only where the pods will see it.

A resize must change what the containers read, or it claims a fit the workload never gets.
Visible places: the container's args (flags in any form, also inside ``bash -c`` scripts), its
env (literal values; ``DSSUP_*`` contract variables, added only to containers that run under
``dssup run`` or already read them), inline DeepSpeed JSON given to ``--deepspeed``, and pod
template annotations that the template itself exposes through the downward API. A job-level
``dssup.io/`` annotation is rewritten too when it states the knob (so the job does not
contradict itself), but it never counts: PyTorchJob, JobSet, Job, TrainJob, Volcano and MPIJob
annotations are not copied to pods. A knob that can only be changed invisibly (a job
annotation alone, a DeepSpeed ConfigMap, a ConfigMap-backed env var) makes ``render`` return
None and the policy tries the next candidate or names the setting in its answer. The caller
re-reads the patched object, also as the pods see it, to prove the patch says what it meant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dssup.admission import annotations as ann
from dssup.admission.argv import ArgvEditor
from dssup.admission.flags import DS_CONFIG, ENV, HF, MEGATRON, SWITCHES
from dssup.admission.source import Sources
from dssup.admission.view import ContainerView, PodSetView, annotation_ref, escape

__all__ = ["KNOB_ANNOTATIONS", "Change", "annotation_ops", "render", "speaks_contract"]

KNOB_ANNOTATIONS = (
    ann.MICRO_BATCH,
    ann.GLOBAL_BATCH,
    ann.SEQ_LENGTH,
    ann.RECOMPUTE,
    ann.ZERO_STAGE,
)
_CONTRACT_ENV = {
    "micro_batch": "DSSUP_MICRO_BATCH_SIZE",
    "global_batch": "DSSUP_GLOBAL_BATCH_SIZE",
    "recompute": "DSSUP_RECOMPUTE",
    "zero_stage": "DSSUP_ZERO_STAGE",
}


def speaks_contract(c: ContainerView) -> bool:
    """The container runs under ``dssup run`` (or ``python -m dssup``) or already reads
    ``DSSUP_*`` variables: it will see the env contract."""
    words = (*c.command, *c.args)
    if any(v.name.startswith("DSSUP_") for v in c.env):
        return True
    for w in words:
        head = w.split()[:3] if " " in w else [w]
        if any(t == "dssup" or t.endswith("/dssup") for t in head):
            return True
        if "dssup run" in w or "-m dssup" in w:
            return True
    return "-m" in words and "dssup" in words


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
        self.annotations: dict[str, str] = {}  # job-level (consistency only: pods never see them)
        self.env_ops: list[dict[str, Any]] = []
        self.template_ops: dict[str, dict[str, Any]] = {}  # pointer -> test/replace ops
        self.new_env: dict[str, dict[str, str]] = {}  # env pointer -> added contract vars
        self.style = style(src)
        inline = src.deepspeed_inline
        self.ds: dict[str, Any] | None = (
            json.loads(json.dumps(src.deepspeed))
            if inline is not None and src.deepspeed is not None and inline.form in ("sep", "eq")
            else None
        )
        self.ds_changed = False

    def gpu_containers(self) -> list[tuple[PodSetView, ContainerView]]:
        return [(ps, c) for ps, c in self.src.containers if not c.launcher]

    def contract(self) -> bool:
        cs = self.gpu_containers()
        return bool(cs) and all(speaks_contract(c) for _, c in cs)

    def set_contract_env(self, knob: str, value: str) -> bool:
        """Give every GPU container ``DSSUP_<KNOB>=value`` (they run under ``dssup run``)."""
        if not self.contract():
            return False
        name = _CONTRACT_ENV[knob]
        for _, c in self.gpu_containers():
            if any(v.name == name for v in c.env):
                continue  # stated: set_env rewrote it (or refused)
            self.new_env.setdefault(c.env_path, {})[name] = value
        return True

    def set_ds(self, knob: str, value: str) -> bool:
        """Rewrite a numeric key of inline DeepSpeed JSON; False when it does not hold one."""
        if self.ds is None:
            return False
        if knob == "zero_stage":
            zero = self.ds.get("zero_optimization")
            if isinstance(zero, dict) and isinstance(zero.get("stage"), int):
                zero["stage"] = int(value)
                self.ds_changed = True
                return True
            return False
        key = DS_CONFIG.get(knob)
        current = self.ds.get(key) if key else None
        if key and isinstance(current, int) and not isinstance(current, bool):
            self.ds[key] = int(value)
            self.ds_changed = True
            return True
        return False

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

    def _template(self, ps: PodSetView, key: str, value: str) -> bool:
        """Rewrite a pod template annotation the containers read through the downward API."""
        if not ps.meta_path or key not in ps.annotations:
            return False
        if ps.meta_path == "/metadata":  # a bare Pod: its own annotations
            self.annotations[key] = value
            return True
        path = f"{ps.meta_path}/annotations/{escape(key)}"
        self.template_ops[path] = {"old": ps.annotations[key], "new": value}
        return True

    def set_env(self, knob: str, value: str) -> tuple[bool, bool]:
        """(found any, all writable) over the env statements of ``knob``."""
        found, ok = False, True
        for ps, c in self.src.containers:
            for var in c.env:
                if var.name not in ENV.get(knob, ()):
                    continue
                found = True
                key = annotation_ref(var.field_ref)
                if key is not None:
                    ok = self._template(ps, key, value) and ok
                    continue
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
        """Rewrite every statement of a knob where the pods see it; False if one of them cannot
        be rewritten or none is visible. A job-level annotation stating the knob is rewritten
        too, and when it is the only statement the contract env carries the value."""
        stated_ann = bool(ann_key and ann_key in self.src.view.annotations)
        if stated_ann and ann_key:
            self.annotations[ann_key] = value
        visible = False
        for names in flag_sets:
            visible = self.set_flag(names, value) or visible
        found, ok = self.set_env(knob, value)
        visible = (found and ok) or visible
        visible = self.set_ds(knob, value) or visible
        if not ok:
            return False
        if not visible and stated_ann:
            return self.set_contract_env(knob, value)
        return visible

    def ops(self) -> list[dict[str, Any]]:
        out = [op for e in self.editors.values() for op in e.ops()] + self.env_ops
        for path, edit in self.template_ops.items():
            out += [
                {"op": "test", "path": path, "value": edit["old"]},
                {"op": "replace", "path": path, "value": edit["new"]},
            ]
        present = {
            c.env_path for _, c in self.src.containers if any(v.position >= 0 for v in c.env)
        }
        for env_path, added in self.new_env.items():
            items = [{"name": k, "value": v} for k, v in added.items()]
            if env_path in present:
                out += [{"op": "add", "path": f"{env_path}/-", "value": item} for item in items]
            else:
                out.append({"op": "add", "path": env_path, "value": items})
        return out


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
    return w.set_contract_env("micro_batch", v)


def _keep_global(w: _Writer, global_batch: int, stated: bool, accum: int) -> bool:
    """Make the global batch explicit (or the accumulation) so the new micro-batch keeps it."""
    if w.style == "hf" or w.src.has(HF["grad_accum"]):
        if w.set_knob("grad_accum", None, str(accum), [HF["grad_accum"]]):
            return True
        return w.append(_HF_ANY, ["--gradient_accumulation_steps", str(accum)])
    if w.set_ds("grad_accum", str(accum)):
        return True
    if stated:
        if ann.GLOBAL_BATCH in w.src.view.annotations and w.style == "annotation":
            # stated as a job annotation only: the pods see it through the contract env
            return w.set_knob("global_batch", ann.GLOBAL_BATCH, str(global_batch), [])
        return True
    if w.style == "megatron":
        return w.append(_MEGATRON_ANY, ["--global-batch-size", str(global_batch)])
    return w.set_contract_env("global_batch", str(global_batch))


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
        found, ok = w.set_env("recompute", new)
        return ok and (found or w.set_contract_env("recompute", new))
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
    if w.set_ds("zero_stage", str(new)):
        return True
    if w.style == "megatron" and new in (0, 1):
        names = SWITCHES["dist_opt"]
        if new == 1:
            return w.src.has(names) or w.append(_MEGATRON_ANY, ["--use-distributed-optimizer"])
        return all(e.remove(names) for e in w.editors.values())
    if w.style == "annotation":
        return w.set_contract_env("zero_stage", str(new))
    return False


def expressible(
    src: Sources, origins: Mapping[str, str], training: Any
) -> dict[str, tuple[Any, ...] | None]:
    """Values a resize may choose per knob (None = any), given how the job states its knobs."""
    kind = style(src)
    zero: tuple[int, ...] | None = None
    inline = src.deepspeed_inline is not None
    if origins.get("zero_stage") == "env-configmap" or (
        (origins.get("zero_stage") == "deepspeed" or kind == "hf") and not inline
    ):
        zero = (training.zero_stage,)
    elif kind == "megatron" and origins.get("zero_stage") != "annotation":
        zero = (0, 1) if training.zero_stage in (0, 1) else (training.zero_stage,)
    recompute: tuple[str, ...] | None = ("none", "full") if kind == "hf" else None
    if origins.get("recompute") in {"deepspeed", "env-configmap"}:
        recompute = (training.recompute,)
    micro = None
    fixed = {"env-configmap"} if inline else {"deepspeed", "env-configmap"}
    if {origins.get("micro_batch"), origins.get("grad_accum")} & fixed:
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
    if w.ds_changed:
        hit = w.src.deepspeed_inline
        if hit is None or not w.set_flag(
            frozenset({hit.flag}), json.dumps(w.ds, separators=(",", ":"))
        ):
            return None
    return w.ops(), w.annotations


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
