"""Flags shared by ``estimate`` and ``plan``: model, layout, training, overheads.

One definition of each flag, so both commands (and their ``--help``) always agree, and one
function that turns the flags into the memory model's objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import click
from click.core import ParameterSource

from dssup.cli.values import (
    BATCH,
    DEGREE,
    LAYERS,
    SEQ_LEN,
    Choice,
    Existing,
    Real,
    Size,
    Whole,
    force_gpu_memory_option,
)
from dssup.errors import ConfigError
from dssup.memory import Layout, ModelSpec, Overheads, Precision, Training
from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.memory.config import Convention
from dssup.memory.defaults import default_precision
from dssup.memory.gpus import find_gpu, parse_size
from dssup.memory.profile import EagerProfile
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import profile_from_json
from dssup.modelio import load_model

__all__ = [
    "HostInputs",
    "build_inputs",
    "given_params",
    "host_inputs",
    "layout_options",
    "load_profile",
    "margin_option",
    "model_options",
    "overhead_options",
    "profile_from_json",
    "training_options",
]

F = TypeVar("F", bound=Callable[..., Any])


def margin_option(fn: F) -> F:
    """``--margin``, as ``plan``, ``plan --nnodes`` and ``plan-elastic`` read it."""
    return click.option(
        "--margin",
        type=Real(0.0, 1.0, hi_open=True),
        default=DEFAULT_MARGIN,
        show_default=True,
        help="Extra fraction of the usable GPU memory kept free. The CUDA context, buffers and "
        "fragmentation are modelled and the driver's reservation is left out already; rows "
        "within the memory model's uncertainty of the limit are marked 'near'.",
    )(fn)


def given_params() -> set[str]:
    """Parameters of the running command the user typed (not defaults)."""
    ctx = click.get_current_context()
    return {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name)
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    }


def _apply(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


def _choice(flag: str, choices: list[str], help: str) -> Callable[[F], F]:
    """An optional choice whose default is decided downstream (and printed there)."""
    return click.option(flag, type=Choice(choices), default=None, help=help)


def model_options(fn: F) -> F:
    return _apply(
        [
            click.option(
                "--model",
                "-m",
                default="deepseek-v3",
                show_default=True,
                help="A Hugging Face config.json (or its folder), a Hub id dssup ships "
                "(meta-llama/Meta-Llama-3-70B, ...: see `dssup models`) or a preset "
                "(deepseek-v3, llama-3-8b, ...).",
            ),
            click.option(
                "--approximate-as",
                default=None,
                metavar="TYPE",
                help="Read a config whose model_type dssup does not know as this known type "
                "(e.g. llama, deepseek_v3, or generic); stated among the assumptions.",
            ),
            click.option(
                "--convention",
                type=Choice(["megatron", "paper"]),
                default="megatron",
                show_default=True,
                help="megatron: what Megatron/DeepSeek code holds; paper: arXiv 2502.07846 "
                "exactly (14 B/param, stored softmax, no logits).",
            ),
            click.option(
                "--gpu-memory",
                type=Size("gpu", many=True),  # plan-elastic, plan --nnodes: one per GPU type
                default=None,
                help="GPU capacity to check against: 80GiB, 80GB, or a GPU name (H100, "
                "A100-40GB, NVIDIA-H100-80GB-HBM3) read as its driver reports it; `dssup gpus` "
                "lists the names. A bare number is refused.",
            ),
            click.option(
                "--host-memory",
                type=Size("host"),
                default=None,
                help="Host (CPU) memory per node to check against, e.g. 2TiB: offloaded states "
                "and the model build must fit it too.",
            ),
            force_gpu_memory_option,
            click.option(
                "--gpus-per-node",
                type=DEGREE,
                default=None,
                help="GPUs sharing one host (default: the reference node of the --gpu-memory "
                "GPU, e.g. 8 for H100; else 8).",
            ),
        ]
    )(fn)


def layout_options(fn: F) -> F:
    return _apply(
        [
            click.option(
                "--tp", type=DEGREE, default=1, show_default=True, help="Tensor-parallel size."
            ),
            click.option(
                "--sp/--no-sp",
                default=True,
                show_default=True,
                help="Sequence parallelism with TP (shards norms and dropout by TP).",
            ),
            click.option(
                "--pp", type=DEGREE, default=1, show_default=True, help="Pipeline stages."
            ),
            click.option(
                "--vpp",
                type=DEGREE,
                default=1,
                show_default=True,
                help="Virtual stages per pipeline rank (interleaved 1F1B when > 1).",
            ),
            click.option(
                "--schedule",
                type=Choice(["1f1b", "interleaved", "dualpipe"]),
                default=None,
                help="Pipeline schedule (default: 1f1b, interleaved if --vpp > 1).",
            ),
            click.option(
                "--ep", type=DEGREE, default=1, show_default=True, help="Expert-parallel size."
            ),
            click.option(
                "--etp",
                type=DEGREE,
                default=1,
                show_default=True,
                help="Expert tensor-parallel size.",
            ),
            click.option(
                "--cp", type=DEGREE, default=1, show_default=True, help="Context-parallel size."
            ),
            click.option(
                "--layers-per-stage",
                default=None,
                help="Explicit split, e.g. 4,4,4,...,1 (one count per stage, pp*vpp with "
                "interleaving; default: even).",
            ),
            click.option(
                "--vpp-group",
                type=DEGREE,
                default=None,
                help="Interleaved: micro-batches per virtual stage at a time (Megatron "
                "--microbatch-group-size-per-virtual-pipeline-stage; default: pp).",
            ),
        ]
    )(fn)


def training_options(fn: F) -> F:
    return _apply(
        [
            click.option(
                "--micro-batch",
                "--micro-batch-size",
                "micro_batch",
                type=BATCH,
                default=1,
                show_default=True,
                help="Sequences per micro-batch per data-parallel rank.",
            ),
            click.option(
                "--seq-len",
                type=SEQ_LEN,
                default=4096,
                show_default=True,
                help="Tokens per sequence.",
            ),
            click.option(
                "--grad-accum",
                type=BATCH,
                default=None,
                help="Micro-batches per step (default: from --global-batch-size, else 1).",
            ),
            click.option(
                "--recompute",
                type=Choice(["none", "selective", "full"]),
                default="none",
                show_default=True,
                help="Activation recomputation (transformers/deepspeed: full = "
                "gradient_checkpointing_enable, one checkpoint per decoder layer).",
            ),
            click.option(
                "--recompute-modules",
                default=None,
                help="Selective recompute: Megatron --recompute-modules, comma-separated from "
                "core_attn, layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts "
                "(default core_attn, Megatron's).",
            ),
            click.option(
                "--recompute-method",
                type=Choice(["uniform", "block"]),
                default=None,
                help="Full recompute: checkpoint every unit of --recompute-num-layers layers "
                "(uniform, default) or only the first that many layers of each stage (block).",
            ),
            click.option(
                "--recompute-num-layers",
                type=LAYERS,
                default=None,
                help="Full recompute: layers per unit (uniform) or per stage (block); default 1.",
            ),
            click.option(
                "--flash-attn/--no-flash-attn",
                default=None,
                help="Fused attention (no s^2 scores) or the framework's unfused one. Default: "
                "on for megatron, off for paper.",
            ),
            _choice(
                "--attention",
                ["flash", "sdpa", "sdpa-cpu", "eager"],
                "Attention kernel: flash, sdpa (PyTorch SDPA as CUDA runs it: flash, or the "
                "memory-efficient kernel when q/k and v head dims differ; no s^2 scores), "
                "sdpa-cpu (as the CPU runs it: the math path with FP32 probabilities when q/k "
                "and v head dims differ; to compare with CPU measurements) or eager (stored "
                "probabilities). Default: by framework.",
            ),
            _choice(
                "--framework",
                ["megatron", "deepseek", "deepspeed", "transformers"],
                "Training code whose kernels decide what is stored: loss, norms, SwiGLU, "
                "MTP, Adam (megatron convention; default megatron).",
            ),
            _choice(
                "--loss",
                ["fused", "unfused"],
                "Cross-entropy: fused vocab-parallel, or unfused (FP32 log-softmax and "
                "two FP32 gradients at the start of backward). Default: by framework.",
            ),
            click.option(
                "--mtp/--no-mtp",
                default=None,
                help="Build the model's multi-token-prediction modules (default: megatron yes, "
                "transformers and deepspeed no).",
            ),
            _choice(
                "--optimizer",
                ["fused", "foreach", "forloop"],
                "Adam implementation: fused (no step temporaries), foreach (one "
                "moment-sized temporary), forloop. Default: by framework.",
            ),
            click.option(
                "--zero",
                type=Whole(0, 3),
                default=0,
                show_default=True,
                help="ZeRO stage (1: optimizer, 2: +gradients, 3: +parameters sharded).",
            ),
            click.option(
                "--offload",
                type=Choice(["none", "optimizer", "params", "both"]),
                default="none",
                show_default=True,
                help="Move optimizer states and/or (ZeRO-3) parameters to host memory.",
            ),
            click.option(
                "--precision",
                type=Choice(["bf16", "fp16", "bf16-lowmom", "fp8", "fp32"]),
                default=None,
                help="Bytes per state (default: convention's; paper = bf16-lowmom). fp8: bf16 "
                "with linear-layer inputs cached in FP8 (TransformerEngine, DeepSeek-V3).",
            ),
            click.option(
                "--calibration",
                type=Existing("file"),
                default=None,
                help="Profile from `dssup calibrate --hf/--module` (JSON): activation and "
                "transient bytes traced from your own model code.",
            ),
            click.option(
                "--dtypes",
                default=None,
                help="Per-state dtypes on top of --precision, e.g. "
                "weights=bf16,grads=fp32,master=fp32,moments=bf16 (master may be none); "
                "activations=fp32|bf16|fp16 is the compute dtype, activations=fp8 caches "
                "linear-layer inputs in FP8.",
            ),
            click.option(
                "--moe-imbalance",
                type=Real(1.0, 1000.0),
                default=1.0,
                show_default=True,
                help="Max/mean routed tokens per rank (megatron convention).",
            ),
        ]
    )(fn)


def overhead_options(fn: F) -> F:
    return _apply(
        [
            click.option(
                "--comm-buffer",
                type=Size("buffer"),
                default=None,
                help="Communication buffers per GPU (e.g. 1GiB).",
            ),
            click.option(
                "--fragmentation",
                type=Real(0.0, 10.0),
                default=None,
                help="Allocator fragmentation, fraction of allocated (e.g. 0.1).",
            ),
            click.option(
                "--cuda-context",
                type=Size("buffer"),
                default=None,
                help="CUDA context per GPU (e.g. 0.75GiB).",
            ),
            click.option(
                "--host-overhead",
                type=Real(0.0, 100.0),
                default=None,
                help="Host memory over the exact offloaded states, as a fraction (default 0.5, "
                "DeepSpeed's estimator's 1.5 buffer factor).",
            ),
            click.option(
                "--host-load-dtype",
                type=Choice(["none", "bf16", "fp16", "fp32"]),
                default="none",
                show_default=True,
                help="Dtype in which every process builds the whole model on the host before "
                "partitioning (HF from_pretrained + DeepSpeed ZeRO 1/2: the checkpoint's dtype; "
                "ZeRO 3 zero.Init: one layer). none: built on the GPU (Megatron).",
            ),
        ]
    )(fn)


def _split(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(
            "--layers-per-stage",
            f"cannot read {text!r}",
            "give comma-separated layer counts, e.g. 4,4,4,1",
        ) from exc


_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "none": 0}
_KEYS = {
    "weights": "weights",
    "grads": "gradients",
    "gradients": "gradients",
    "master": "master",
    "moments": "moments",
    "activations": "activations",
}


def _precision(name: str | None, dtypes: str | None, convention: Convention) -> Precision | None:
    """``--precision`` preset (else the convention's default), then ``--dtypes key=dtype,...``
    on top."""
    if not dtypes:
        return Precision.named(name) if name else None
    base = Precision.named(name) if name else default_precision(convention)
    update: dict[str, int | bool] = {}
    for item in dtypes.split(","):
        key, _, dtype = item.partition("=")
        key, dtype = key.strip(), dtype.strip().lower()
        if key not in _KEYS or dtype not in _BYTES or (dtype == "none" and key != "master"):
            raise ConfigError(
                "--dtypes",
                f"cannot read {item!r}",
                f"use key=dtype with keys {', '.join(sorted(_KEYS))} and dtypes "
                f"{', '.join(_BYTES)} (none only for master)",
            )
        if key == "activations":
            update["cache_fp8"] = dtype == "fp8"
            update["activations"] = 2 if dtype == "fp8" else _BYTES[dtype]
            continue
        if dtype == "fp8":
            raise ConfigError(
                "--dtypes",
                f"{key}=fp8 is not modelled (FP8 weights, gradients or optimizer states)",
                "use fp8 only for activations",
            )
        update[_KEYS[key]] = _BYTES[dtype]
    return Precision.model_validate({**base.model_dump(), **update})


def _modules(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(x.strip() for x in text.split(",") if x.strip())


def load_profile(path: Path | None) -> EagerProfile | TracedProfile | None:
    """The profile ``dssup calibrate`` wrote: ``traced`` (format 2, the user's own code) or
    ``eager`` (format 1, reference blocks); a newer format is refused by its version."""
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "--calibration",
            f"{path} is not a calibration file ({exc.__class__.__name__})",
            "pass the JSON written by `dssup calibrate`",
        ) from exc
    return profile_from_json(doc, str(path))


def build_layout(o: dict[str, Any], dp: int) -> Layout:
    schedule = o["schedule"] or ("interleaved" if o["vpp"] > 1 else "1f1b")
    return Layout(
        tp=o["tp"],
        sp=o["sp"],
        pp=o["pp"],
        vpp=o["vpp"],
        ep=o["ep"],
        etp=o["etp"],
        dp=dp,
        cp=o["cp"],
        schedule=schedule,
        layers_per_stage=_split(o["layers_per_stage"]),
        vpp_group=o.get("vpp_group"),
    )


def build_training(o: dict[str, Any], grad_accum: int) -> Training:
    return Training(
        micro_batch=o["micro_batch"],
        seq_len=o["seq_len"],
        grad_accum=grad_accum,
        recompute=o["recompute"],
        flash_attention=o["flash_attn"],
        zero_stage=o["zero"],
        offload_optimizer=o["offload"] in ("optimizer", "both"),
        offload_params=o["offload"] in ("params", "both"),
        precision=_precision(
            o.get("precision"), o.get("dtypes"), o.get("convention") or "megatron"
        ),
        implementation=load_profile(o.get("calibration")),
        moe_imbalance=o["moe_imbalance"],
        framework=o.get("framework"),
        loss=o.get("loss"),
        mtp=o.get("mtp"),
        attention=o.get("attention"),
        optimizer=o.get("optimizer"),
        recompute_modules=_modules(o.get("recompute_modules")),
        recompute_method=o.get("recompute_method"),
        recompute_num_layers=o.get("recompute_num_layers"),
    )


def build_overheads(o: dict[str, Any]) -> Overheads:
    return Overheads(
        comm_buffer_bytes=parse_size(o["comm_buffer"], "--comm-buffer", gpu=False, zero=True)
        if o["comm_buffer"]
        else None,
        fragmentation=o["fragmentation"],
        cuda_context_bytes=parse_size(o["cuda_context"], "--cuda-context", gpu=False, zero=True)
        if o["cuda_context"]
        else None,
        **_host_overheads(o),
    )


def _host_overheads(o: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"host_load_bytes": _BYTES[o.get("host_load_dtype") or "none"]}
    if o.get("host_overhead") is not None:
        out["host_overhead"] = o["host_overhead"]
    return out


class HostInputs(NamedTuple):
    """The host a config is checked against: memory per node (None: not known), GPUs sharing
    it, and where each figure came from (printed with the answer)."""

    memory: int | None
    memory_source: str
    per_node: int
    per_node_source: str

    def notes(self, needed: bool) -> list[str]:
        """The assumption lines: the GPUs per node always; the host memory when it was
        assumed, or that it was not checked when the config needs host memory."""
        out = [f"GPUs per node: {self.per_node} ({self.per_node_source})"]
        if self.memory is not None and self.memory_source != "--host-memory":
            out.append(
                f"host memory {self.memory / (1 << 30):,.0f} GiB per node ({self.memory_source}, "
                "assumed; give --host-memory to state yours)"
            )
        elif self.memory is None and needed:
            out.append(f"host memory NOT CHECKED: {self.memory_source}")
        return out


def host_inputs(o: dict[str, Any], gpu: str | None = None) -> HostInputs:
    """The node a config runs on: ``--host-memory`` and ``--gpus-per-node`` when given, else
    the reference node of the GPU ``gpu`` (default: what ``--gpu-memory`` names; ``dssup
    gpus``), else unknown."""
    host = (
        parse_size(o["host_memory"], "--host-memory", gpu=False) if o.get("host_memory") else None
    )
    names = [n for n in (gpu or o.get("gpu_memory") or "").split(",") if n.strip()]
    spec = find_gpu(names[0], "--gpu-memory") if len(names) == 1 else None
    ref = f"{spec.system.name}, the {spec.name} reference node" if spec is not None else ""
    if host is not None:
        memory_source = "--host-memory"
    elif spec is not None and spec.system.host_memory_bytes:
        host, memory_source = spec.system.host_memory_bytes, ref
    elif spec is not None:
        memory_source = (
            f"the host memory of the {spec.name} reference node is not known; give --host-memory"
        )
    else:
        memory_source = "no --host-memory, and --gpu-memory names no GPU whose node dssup knows"
    if o.get("gpus_per_node"):
        count, count_source = o["gpus_per_node"], "--gpus-per-node"
    elif spec is not None:
        count, count_source = spec.system.gpus_per_node, ref
    else:
        count, count_source = 8, "default; give --gpus-per-node or a GPU name in --gpu-memory"
    return HostInputs(host, memory_source, count, count_source)


def build_inputs(
    o: dict[str, Any], dp: int, grad_accum: int
) -> tuple[ModelSpec, Layout, Training, Overheads, int | None]:
    model = load_model(o["model"], o.get("approximate_as"))
    gpu = parse_size(o["gpu_memory"], "--gpu-memory") if o.get("gpu_memory") else None
    return model, build_layout(o, dp), build_training(o, grad_accum), build_overheads(o), gpu
