"""Build the user's model from its source, as the ``Job`` a training step runs.

``--hf``: ``AutoModelForCausalLM.from_config`` of the config (random init, the transformers
class of ``model_type``; configs that need remote code are refused, nothing is downloaded), in
the step's dtype and attention implementation. ``--module pkg.mod:factory``: the user's function,
which returns ``(model, make_batch)``; ``make_batch(micro_batch, seq_len)`` returns the keyword
arguments of ``model(...)``, whose result is the loss (a scalar tensor, or an object with a
``loss`` attribute, as transformers returns).

Both are built inside whatever tensor mode is active, so under ``FakeTensorMode`` nothing is
allocated, at any size.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dssup.errors import ConfigError
from dssup.runtime.traced.blocks import Stack, find_stack
from dssup.runtime.traced.knobs import HFSource, Knobs, ModuleSource, TracedRun

__all__ = ["Job", "build", "checkpoint_blocks", "versions"]

Batch = dict[str, torch.Tensor]


@dataclass
class Job:
    """A model ready to train and how to feed it."""

    model: nn.Module
    make_batch: Callable[[int, int], Batch]
    stack: Stack
    call: Callable[[nn.Module, Batch], Any]  # model, batch -> output holding the loss


def versions() -> dict[str, str]:
    """torch and (when importable) transformers versions, for provenance."""
    out = {"torch": str(torch.__version__)}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def loss_of(out: Any) -> torch.Tensor:
    """The loss in a model's output: the tensor itself or its ``loss`` attribute."""
    loss = getattr(out, "loss", out)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ConfigError(
            "model output",
            f"is {type(out).__name__}, not a scalar loss",
            "return the loss, or an object with a .loss scalar, from model(**batch)",
        )
    return loss


def _hf_model(src: HFSource, knobs: Knobs) -> nn.Module:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = dict(src.config)
    model_type = str(cfg.get("model_type"))
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(
            "--hf",
            f"model_type {model_type!r} is not built into transformers (remote code is never run)",
            "use --module with a factory that builds your model",
        )
    config = CONFIG_MAPPING[model_type].from_dict(cfg)
    dtype = torch.bfloat16 if knobs.dtype == "bf16" else torch.float32
    model: nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, attn_implementation=knobs.attention, dtype=dtype
    )
    if knobs.checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})  # type: ignore[operator]
    return model


def _hf_job(src: HFSource, knobs: Knobs) -> Job:
    model = _hf_model(src, knobs)
    vocab = int(src.config["vocab_size"])

    def make_batch(b: int, s: int) -> Batch:
        ids = torch.randint(0, vocab, (b, s))
        return {"input_ids": ids, "labels": ids}

    def call(m: nn.Module, batch: Batch) -> Any:
        return m(**batch, use_cache=False)

    return Job(model, make_batch, find_stack(model), call)


def _factory(src: ModuleSource) -> Callable[[], Any]:
    mod_name, _, fn_name = src.target.partition(":")
    if not mod_name or not fn_name:
        raise ConfigError("--module", f"{src.target!r} is not 'package.module:function'", "")
    for folder in reversed(src.sys_path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            "--module", f"cannot import {src.target} ({exc})", "check the module path"
        ) from exc
    if not callable(fn):
        raise ConfigError("--module", f"{src.target} is not callable", "name a function")
    return fn  # type: ignore[no-any-return]


def _checkpoint(blocks: list[nn.Module]) -> None:
    """Recompute each block in backward (only its inputs kept): torch.utils.checkpoint."""
    for block in blocks:
        forward = block.forward

        def run(*args: Any, forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        block.forward = run


@contextlib.contextmanager
def checkpoint_blocks(blocks: list[nn.Module]) -> Iterator[None]:
    """``_checkpoint`` while the context lasts."""
    _checkpoint(blocks)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # the class's forward again


def _to_bf16(model: nn.Module) -> None:
    """``model.to(torch.bfloat16)`` tensor by tensor: under FakeTensorMode ``Module.to`` must
    swap the fake parameters in place, which it refuses ("Couldn't swap Embedding.weight")."""
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None and p.is_floating_point():
                mod._parameters[name] = nn.Parameter(p.detach().to(torch.bfloat16), p.requires_grad)
        for name, buf in mod._buffers.items():
            if buf is not None and buf.is_floating_point():
                mod._buffers[name] = buf.to(torch.bfloat16)


def _module_job(src: ModuleSource, knobs: Knobs) -> Job:
    made = _factory(src)()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ConfigError(
            "--module", f"{src.target} returned {type(made).__name__}", "return (model, make_batch)"
        )
    model, make_batch = made
    if knobs.dtype == "bf16":
        _to_bf16(model)
    stack = find_stack(model)
    if knobs.checkpointing:  # for the model's lifetime (not a context: one left unreferenced
        _checkpoint(stack.blocks)  # is closed at once, undoing it)

    def call(m: nn.Module, batch: Batch) -> Any:
        return m(**batch)

    return Job(model, make_batch, stack, call)


def build(run: TracedRun) -> Job:
    """The model of ``run`` (built in the active tensor mode), its blocks reduced to
    ``run.keep_blocks``."""
    src = run.source
    job = _hf_job(src, run.knobs) if isinstance(src, HFSource) else _module_job(src, run.knobs)
    if run.keep_blocks is not None:
        job.stack = job.stack.keep(job.model, run.keep_blocks)
    job.model.train()
    return job
