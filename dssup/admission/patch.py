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
from dssup.admission.flags import HF, MEGATRON, SWITCHES
from dssup.admission.source import Sources
from dssup.admission.view import escape
from dssup.admission.writer import HF_ANY, MEGATRON_ANY, Writer, speaks_contract, style

__all__ = ["KNOB_ANNOTATIONS", "Change", "annotation_ops", "render", "speaks_contract", "style"]

Change = dict[str, tuple[Any, Any]]  # knob -> (old, new)
KNOB_ANNOTATIONS = (
    ann.MICRO_BATCH,
    ann.GLOBAL_BATCH,
    ann.SEQ_LENGTH,
    ann.RECOMPUTE,
    ann.ZERO_STAGE,
)


def _micro(w: Writer, new: int) -> bool:
    v = str(new)
    if w.set_knob("micro_batch", ann.MICRO_BATCH, v, [MEGATRON["micro_batch"], HF["micro_batch"]]):
        return True
    if w.style == "megatron":
        return w.append(MEGATRON_ANY, ["--micro-batch-size", v])
    if w.style == "hf":
        return w.append(HF_ANY, ["--per_device_train_batch_size", v])
    return w.set_contract_env("micro_batch", v)


def _keep_global(w: Writer, global_batch: int, stated: bool, accum: int) -> bool:
    """Make the global batch explicit (or the accumulation) so the new micro-batch keeps it."""
    if w.style == "hf" or w.src.has(HF["grad_accum"]):
        if w.set_knob("grad_accum", None, str(accum), [HF["grad_accum"]]):
            return True
        return w.append(HF_ANY, ["--gradient_accumulation_steps", str(accum)])
    if w.set_ds("grad_accum", str(accum)):
        return True
    if stated:
        if ann.GLOBAL_BATCH in w.src.view.annotations and w.style == "annotation":
            # stated as a job annotation only: the pods see it through the contract env
            return w.set_knob("global_batch", ann.GLOBAL_BATCH, str(global_batch), [])
        return True
    if w.style == "megatron":
        return w.append(MEGATRON_ANY, ["--global-batch-size", str(global_batch)])
    return w.set_contract_env("global_batch", str(global_batch))


def _recompute(w: Writer, old: str, new: str) -> bool:
    if ann.RECOMPUTE in w.src.view.annotations:
        w.annotations[ann.RECOMPUTE] = new
    if w.style == "hf":
        if new == "selective":
            return False
        names = HF["recompute"]
        if new == "full":
            return w.set_flag(names, "true") or w.append(HF_ANY, ["--gradient_checkpointing"])
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
    return w.append(MEGATRON_ANY, tokens)


def _zero(w: Writer, new: int) -> bool:
    if w.set_knob("zero_stage", ann.ZERO_STAGE, str(new), []):
        return True
    if w.set_ds("zero_stage", str(new)):
        return True
    if w.style == "megatron" and new in (0, 1):
        names = SWITCHES["dist_opt"]
        if new == 1:
            return w.src.has(names) or w.append(MEGATRON_ANY, ["--use-distributed-optimizer"])
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
    w = Writer(src)
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
