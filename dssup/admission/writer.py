"""Where a resize writes a knob so that the pods see it: argv, env, inline DeepSpeed JSON,
downward-API template annotations; job-level annotations only for consistency.

``Writer`` collects the edits of one resize (``patch.render`` decides which knobs to write and in
which style); ``ops`` turns them into guarded JSON Patch operations.
"""

from __future__ import annotations

import json
from typing import Any

from dssup.admission.argv import ArgvEditor, find_lists
from dssup.admission.flags import DS_CONFIG, ENV, HF, MEGATRON, SWITCHES
from dssup.admission.source import Sources
from dssup.admission.view import ContainerView, PodSetView, annotation_ref, escape

__all__ = ["HF_ANY", "MEGATRON_ANY", "Writer", "assumed_defaults", "speaks_contract", "style"]

_FSDP = frozenset({"--fsdp", "--fsdp_config", "--fsdp-config"})

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


MEGATRON_ANY = frozenset().union(*MEGATRON.values(), *SWITCHES.values())
MEGATRON_OWN = frozenset().union(
    *MEGATRON.values(), SWITCHES["sp"], SWITCHES["dist_opt"], SWITCHES["recompute_activations"]
)
HF_ANY = frozenset().union(*HF.values())


def assumed_defaults(src: Sources, cfg: Any) -> tuple[str, ...]:
    """Memory-relevant knobs taken from dssup's defaults rather than the job's launcher: a
    sequence length nobody stated; recompute and ZeRO when the job's launcher is not one whose
    defaults dssup knows (Megatron, or the HF Trainer without --fsdp). A job that does not fit
    only under such guesses is not denied."""
    origins = cfg.origins
    out = []
    if origins.get("seq_len") == "default":
        out.append(f"sequence length {cfg.training.seq_len}")
    kind = style(src)
    known = kind == "megatron" or (kind == "hf" and not src.has(_FSDP))
    if not known and origins.get("recompute") == "default":
        out.append("recompute none")
    if not known and origins.get("zero_stage") == "default":
        out.append("ZeRO-0")
    return tuple(out)


def style(src: Sources) -> str:
    """``megatron``, ``hf`` or ``annotation``: how the job states its knobs."""
    if src.has(MEGATRON_OWN):
        return "megatron"
    return "hf" if src.has(HF_ANY) else "annotation"


class Writer:
    """Edits of one resize, by the channel the pods see (see the module docstring)."""

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

    return bool(find_lists(editor.lists, names))
