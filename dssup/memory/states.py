"""What a device holds besides activations: model states after ZeRO and offload, the ZeRO-3
working set, the optimizer-step temporaries, and the later moments of an eager backward.

Split from ``core.py`` (which prepares stages and devices); both ``estimate`` and ``plan`` use
these functions, so they agree to the byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dssup.memory.config import Convention, Layout, Overheads, Recompute, Training
from dssup.memory.defaults import Resolved
from dssup.memory.offload import host_at_start, host_terms, with_overhead
from dssup.memory.profile import EagerProfile, eager_constant, eager_tail
from dssup.memory.traced import TracedProfile
from dssup.memory.zero import ModelStates, model_states

if TYPE_CHECKING:
    from dssup.memory.core import PreparedDevice

__all__ = ["States", "constant", "finish", "states", "tails", "zero3_working_set"]


@dataclass(frozen=True, slots=True)
class States:
    """Config-dependent, micro-batch-independent bytes of one device."""

    ms: ModelStates
    static: int  # weights + gradients + optimizer on the device
    working_set: int  # ZeRO-3 gathered parameters
    transient: int  # optimizer-step temporaries
    host: int  # offloaded states on the host, per GPU (with the host overhead)
    tail: int | None = None  # eager end of backward over ``static``, less its per-sample bytes
    host_init: int = 0  # host bytes per GPU while the model is built (with the host overhead)
    grads_freed: bool = False  # gradients exist only from backward to the optimizer step
    host_terms: tuple[tuple[str, int], ...] = ()  # ``host`` by term (``offload.HOST_TERMS``)


def zero3_working_set(largest: int, conv: Convention, r: Resolved, ov: Overheads) -> int:
    """Bytes of ZeRO-3 gathered parameters alive at once, for a device whose largest layer has
    ``largest`` parameters. ``paper``: min(max_live, largest layer + prefetch bucket).
    Frameworks: a layer larger than max_live is still gathered whole, and its gradient (in the
    weights' dtype, before the reduce-scatter) is alive with it in backward; that is
    DeepSpeed's estimator's 4 B per largest-layer parameter, plus prefetch."""
    live = min(ov.zero3_max_live_parameters, largest + ov.zero3_prefetch_bucket)
    if conv == "paper":
        return r.precision.weights * live
    return r.precision.weights * (max(largest, live) + largest)


def states(
    dev: PreparedDevice, layout: Layout, t: Training, conv: Convention, r: Resolved, ov: Overheads
) -> States:
    dp_shard = layout.dp * (layout.cp if conv == "megatron" else 1)
    frameworks = conv != "paper"
    ms = model_states(
        dev.split.non_moe,
        dev.split.moe,
        dp_shard,
        layout.edp,
        t.zero_stage,
        r.precision,
        t.offload_optimizer,
        t.offload_params,
        frameworks,
    )
    ws = zero3_working_set(dev.largest_layer, conv, r, ov) if t.zero_stage == 3 else 0
    host, host_init = ms.host, 0
    terms = _paper_terms(ms, t, r) if ms.host else {}
    if frameworks and (t.offload_optimizer or t.offload_params or ov.host_load_bytes):
        terms = host_terms(
            ms.shard_params,
            t.zero_stage,
            r.precision,
            t.offload_optimizer,
            t.offload_params,
            t.grad_accum,
        )
        exact = sum(terms.values())
        load = host_at_start(dev.split.total, dev.largest_layer, t.zero_stage, ov.host_load_bytes)
        host, host_init = (
            with_overhead(exact, ov.host_overhead),
            with_overhead(load, ov.host_overhead),
        )
        if host > exact:
            terms["pinned_buffers"] = host - exact
    if t.implementation is not None:
        if t.offload_optimizer and not frameworks:  # paper: the update's temporaries move too
            step = math.ceil(t.implementation.optimizer_transient_per_param * ms.shard_params)
            host += step
            terms["optimizer_step"] = terms.get("optimizer_step", 0) + step
        found = (
            _traced_states(t, ms, ws, host, host_init)
            if isinstance(t.implementation, TracedProfile)
            else _eager_states(dev, t, ms, ws, host, host_init)
        )
        return replace(found, host_terms=tuple(terms.items()))
    stepped = ms.shard_params
    if frameworks and t.zero_stage == 3:  # DeepSpeed steps one sub-group at a time
        stepped = min(stepped, ov.zero3_sub_group)
    transient = r.optimizer_transient_per_param * stepped
    if r.optimizer == "forloop":  # one tensor at a time: sqrt, then the division
        transient = 2 * r.precision.moments * _largest_tensor(dev)
    if t.offload_optimizer:  # the update runs on the host
        if not frameworks and transient:
            host += transient
            terms["optimizer_step"] = terms.get("optimizer_step", 0) + transient
        transient = 0
    # zero_grad(set_to_none=True) frees gradients after each step: without accumulation
    # they exist from backward to the optimizer step only (transformers).
    freed = frameworks and r.framework == "transformers" and t.grad_accum == 1
    grads_fb = 0 if freed else ms.gradients
    static = ms.weights + grads_fb + ms.optimizer
    transient += ms.gradients - grads_fb
    return States(ms, static, ws, transient, host, None, host_init, freed, tuple(terms.items()))


def _paper_terms(ms: ModelStates, t: Training, r: Resolved) -> dict[str, int]:
    """``ms.host`` (what the paper convention moves) by term: the optimizer states, then the
    parameters (ZeRO 3)."""
    opt = r.precision.optimizer * ms.shard_params if t.offload_optimizer else 0
    return {k: v for k, v in (("optimizer_states", opt), ("parameters", ms.host - opt)) if v}


def _largest_tensor(dev: PreparedDevice) -> int:
    """Elements of the largest parameter tensor a device holds."""
    return max(st.params.largest_tensor for st in dev.stages)


def _traced_states(t: Training, ms: ModelStates, ws: int, host: int, host_init: int) -> States:
    """A traced profile: like eager, gradients exist from backward to the optimizer step only
    (unless accumulating); the replay adds everything else (``traced_device``)."""
    p = t.implementation
    assert isinstance(p, TracedProfile)  # checked by the caller; not input validation
    grads_fb = ms.gradients if t.grad_accum > 1 else 0
    opt_tmp = (
        0 if t.offload_optimizer else math.ceil(p.optimizer_transient_per_param * ms.shard_params)
    )
    static = ms.weights + ms.optimizer + grads_fb
    transient = ms.gradients - grads_fb + opt_tmp
    return States(ms, static, ws, transient, host, None, host_init, grads_fb == 0)


def _eager_states(
    dev: PreparedDevice, t: Training, ms: ModelStates, ws: int, host: int, host_init: int
) -> States:
    """Eager PyTorch: gradients exist only from backward to the optimizer step (unless
    accumulating), so in forward/backward they are not part of ``static``; they and the
    optimizer temporaries make up the optimizer-step transient. Batch-independent saved bytes
    (autocast weight copies, the head gradient at the backward peak) join the working set."""
    p = t.implementation
    assert isinstance(p, EagerProfile)  # checked by the caller; not input validation
    grads_fb = 0 if (p.grads_freed_between_steps and t.grad_accum == 1) else ms.gradients
    dense = sum(st.params.dense_layers for st in dev.stages)
    moe = sum(st.params.moe_layers for st in dev.stages)
    zero3_ws = ws
    ws += eager_constant(p, dense, moe, dev.edge, t.recompute)
    opt_tmp = math.ceil(p.optimizer_transient_per_param * ms.shard_params)
    if t.offload_optimizer:
        opt_tmp = 0
    static = ms.weights + ms.optimizer + grads_fb
    found = eager_tail(p, t.recompute, t.seq_len, 1)
    tail = None if found is None else zero3_ws + ms.gradients - grads_fb + found[1]
    return States(ms, static, ws, ms.gradients - grads_fb + opt_tmp, host, tail, host_init)


def tails(
    dev: PreparedDevice, s: States, t: Training, r: Resolved, rc: Recompute
) -> list[tuple[int, int]]:
    """Other forward-backward moments that can top the start of backward, as (bytes that do
    not depend on the micro-batch, per-sample bytes): an eager profile's end of backward, and
    the backward moments of frameworks that free gradients between steps."""
    out: list[tuple[int, int]] = []
    if s.tail is None and not dev.stages[0].moments:
        return out
    buffers = r.comm_buffer_bytes
    if s.tail is not None and dev.tail is not None:
        out.append((s.static + s.tail + buffers, dev.tail[rc]))
    for mo in dev.stages[0].moments if len(dev.stages) == 1 else ():
        if mo.grad_params and not s.grads_freed:
            continue  # accumulating: the start of backward, gradients included, is higher
        grads = s.ms.gradients * mo.grad_params // max(dev.split.total, 1)
        base = s.static + s.working_set + grads + buffers
        out.append((base + mo.const[rc], mo.per_sample[rc]))
    return out


def constant(dev: PreparedDevice, rc: Recompute) -> int:
    """Batch-independent saved bytes of the device at the start of backward (autocast)."""
    return dev.consts[rc]


def finish(alloc: int, r: Resolved, ov: Overheads) -> tuple[int, int]:
    """(fragmentation bytes, device total) from the allocator peak."""
    frag = math.ceil(alloc * r.fragmentation)
    return frag, alloc + frag + r.cuda_context_bytes + ov.calibration_bytes
