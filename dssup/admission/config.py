"""Turn a job's raw statements (``Sources``) into the memory model's inputs.

``resolve`` returns a ``JobConfig`` (model, layout, training, global batch, and where each knob
came from) or raises ``Incomplete`` listing what is missing (the policy allows such jobs with a
warning: dssup never blocks what it cannot judge). Values that contradict the model or each
other raise ``ConfigError`` (the policy denies those in enforcing namespaces).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from dssup.admission import annotations as ann
from dssup.admission.cache import ClusterCache
from dssup.admission.flags import HF, PEFT_ENV, PEFT_FLAGS, SWITCHES, TORCHTUNE_CONFIG
from dssup.admission.model import job_model
from dssup.admission.source import Found, Incomplete, Sources, positive, switch
from dssup.errors import ConfigError
from dssup.memory import Layout, ModelSpec, Precision, Training

__all__ = ["Incomplete", "JobConfig", "resolve"]


class JobConfig(NamedTuple):
    """Everything the memory model needs, plus provenance for patches and messages."""

    model: ModelSpec
    model_key: str
    layout: Layout
    training: Training
    global_batch: int
    global_batch_stated: bool
    origins: dict[str, str]  # knob -> annotation|megatron|hf|...
    warnings: tuple[str, ...] = ()


def _layout_values(src: Sources, cache: ClusterCache) -> dict[str, int | bool]:
    values: dict[str, int | bool] = {}
    for key in ("tp", "pp", "ep", "etp", "cp", "vpp"):
        n = positive(src.lookup(key, None, cache), key)
        if n is not None:
            values[key] = n
    values["sp"] = switch(src, "sp")
    text = src.view.annotations.get(ann.LAYOUT)
    if text:
        values.update(ann.parse_layout(text))
    return values


def _recompute(src: Sources, cache: ClusterCache) -> Found | None:
    found = src.lookup("recompute", ann.RECOMPUTE, cache)
    if found is not None and found.origin == "hf":
        return Found(
            "full" if found.value.lower() in {"1", "true", "yes"} else "none", "hf", found.where
        )
    if found is None:
        hit = src.flag(HF["recompute"])
        if hit is not None:
            return Found("full", "hf", hit.flag)
        hit = src.flag(SWITCHES["recompute_activations"])
        if hit is not None:
            return Found("selective", "megatron", hit.flag)
    if found is not None and found.value not in {"none", "selective", "full"}:
        raise ConfigError(found.where, f"recompute {found.value!r}", "use none, selective or full")
    return found


def _zero(src: Sources, cache: ClusterCache) -> Found | None:
    found = src.lookup("zero_stage", ann.ZERO_STAGE, cache)
    if found is not None:
        return found
    ds = src.deepspeed or {}
    stage = (ds.get("zero_optimization") or {}).get("stage") if isinstance(ds, dict) else None
    if isinstance(stage, int):
        return Found(str(stage), "deepspeed", "DeepSpeed zero_optimization.stage")
    hit = src.flag(SWITCHES["dist_opt"])
    if hit is not None:
        return Found("1", "megatron", hit.flag)
    return None


def _offload(src: Sources) -> tuple[bool, bool]:
    text = src.view.annotations.get(ann.OFFLOAD)
    if text is not None:
        parts = {p.strip() for p in text.split(",")}
        return "optimizer" in parts, "params" in parts
    zero = (src.deepspeed or {}).get("zero_optimization") or {}

    def dev(key: str) -> bool:
        return (zero.get(key) or {}).get("device") in {"cpu", "nvme"}

    return dev("offload_optimizer"), dev("offload_param")


def _precision(src: Sources) -> Precision | None:
    text = src.view.annotations.get(ann.PRECISION)
    if text:
        return Precision.named(text)
    if switch(src, "fp16"):
        return Precision.named("fp16")
    return None


def _seq(src: Sources, cache: ClusterCache, warnings: list[str]) -> tuple[int, str]:
    found = src.lookup("seq_len", ann.SEQ_LENGTH, cache)
    n = positive(found, "sequence length")
    if n is None or found is None:
        warnings.append("sequence length not stated; assuming 4096 (add --seq-length)")
        return 4096, "default"
    return n, found.origin


def _batches(src: Sources, cache: ClusterCache, dp: int) -> tuple[int, int, bool, dict[str, str]]:
    """(micro-batch, global batch, whether the global batch is stated, origins)."""
    origins: dict[str, str] = {}
    f_micro = src.lookup("micro_batch", ann.MICRO_BATCH, cache)
    f_global = src.lookup("global_batch", ann.GLOBAL_BATCH, cache)
    f_accum = src.lookup("grad_accum", None, cache)
    micro = positive(f_micro, "micro-batch size") or 1
    accum = positive(f_accum, "gradient accumulation") or 1
    origins["micro_batch"] = f_micro.origin if f_micro else "default"
    origins["grad_accum"] = f_accum.origin if f_accum else "default"
    stated = positive(f_global, "global batch size")
    origins["global_batch"] = f_global.origin if f_global else "derived"
    global_batch = stated or micro * accum * dp
    if global_batch % (micro * dp):
        where = f_global.where if f_global else "global batch"
        raise ConfigError(
            where,
            f"global batch {global_batch} is not a multiple of micro-batch "
            f"{micro} x data-parallel {dp}",
            "choose a global batch divisible by mbs x dp",
        )
    return micro, global_batch, stated is not None, origins


@lru_cache(maxsize=1024)
def _layout(tp: int, pp: int, cp: int, dp: int, ep: int, etp: int, sp: bool, vpp: int) -> Layout:
    """Validated once per distinct layout: the models are frozen, and many jobs share one."""
    schedule = "interleaved" if vpp >= 2 else "1f1b"
    return Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, sp=sp, vpp=vpp, schedule=schedule)


@lru_cache(maxsize=1024)
def _training(
    micro: int,
    seq: int,
    accum: int,
    recompute: str,
    zero: int,
    off_opt: bool,
    off_par: bool,
    precision: Precision | None,
) -> Training:
    """Validated once per distinct setting (see ``_layout``)."""
    return Training(
        micro_batch=micro,
        seq_len=seq,
        grad_accum=accum,
        recompute=recompute,
        zero_stage=zero,
        offload_optimizer=off_opt,
        offload_params=off_par,
        precision=precision,
    )


def _peft(src: Sources) -> str | None:
    """Where the job says it fine-tunes with LoRA/PEFT (full training is what dssup models)."""
    for name in sorted(PEFT_FLAGS):
        hit = src.flag(frozenset({name}))
        if hit is not None and (
            name not in {"--finetuning_type", "--finetuning-type"}
            or ((hit.value or "").lower() in {"lora", "qlora", "freeze"})
        ):
            return hit.flag if hit.value is None else f"{hit.flag} {hit.value}"
    for name in PEFT_ENV:
        if src.literal_env(name):
            return f"env {name}"
    config = src.value(TORCHTUNE_CONFIG) or ""
    if "lora" in config.lower():
        return f"torchtune config {config}"
    return None


def resolve(src: Sources, cache: ClusterCache, world_size: int) -> JobConfig:
    """Model, layout and training of the job; ``Incomplete`` or ``ConfigError`` otherwise."""
    if src.problems:
        raise Incomplete(list(src.problems))
    peft = _peft(src)
    if peft is not None:
        raise Incomplete(
            [f"LoRA/PEFT fine-tuning ({peft}): dssup models full training only, not adapters"]
        )
    model, model_key = job_model(src, cache)
    warnings = list(src.warnings)
    lv = _layout_values(src, cache)
    tp, pp, cp = int(lv.get("tp", 1)), int(lv.get("pp", 1)), int(lv.get("cp", 1))
    if world_size % (tp * pp * cp):
        raise ConfigError(
            "layout",
            f"{world_size} GPUs is not a multiple of tp*pp*cp={tp * pp * cp}",
            "request GPUs in multiples of the model-parallel size",
        )
    dp = world_size // (tp * pp * cp)
    vpp = int(lv.get("vpp", 1))
    per_vstage = positive(src.lookup("layers_per_vstage", None, cache), "layers per virtual stage")
    if per_vstage and model.layers % (pp * per_vstage) == 0:
        vpp = model.layers // (pp * per_vstage)
    layout = _layout(
        tp, pp, cp, dp, int(lv.get("ep", 1)), int(lv.get("etp", 1)), bool(lv.get("sp", False)), vpp
    )
    micro, global_batch, stated, origins = _batches(src, cache, dp)
    seq, origins["seq_len"] = _seq(src, cache, warnings)
    f_rec, f_zero = _recompute(src, cache), _zero(src, cache)
    origins["recompute"] = f_rec.origin if f_rec else "default"
    origins["zero_stage"] = f_zero.origin if f_zero else "default"
    zero = 0
    if f_zero is not None:
        if f_zero.value.strip() not in {"0", "1", "2", "3"}:
            raise ConfigError(f_zero.where, f"ZeRO stage {f_zero.value!r}", "use 0, 1, 2 or 3")
        zero = int(f_zero.value)
    off_opt, off_par = _offload(src)
    training = _training(
        micro,
        seq,
        global_batch // (micro * dp),
        f_rec.value if f_rec else "none",
        zero,
        off_opt,
        off_par,
        _precision(src),
    )
    from dssup.admission.calibration import calibration  # it raises this module's Incomplete

    profile = calibration(src.view.annotations, src.view.namespace, cache)
    if profile is not None:
        training = training.model_copy(update={"implementation": profile})
        origins["calibration"] = "annotation"
    return JobConfig(
        model, model_key, layout, training, global_batch, stated, origins, tuple(warnings)
    )
