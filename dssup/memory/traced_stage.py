"""A ``TracedProfile`` inside ``estimate`` and ``plan``: one stage's peaks from the replay.

The memory model keeps what it computes exactly -- weights, gradients and optimizer states after
TP/EP splitting, ZeRO and offload -- and takes from the profile what was traced: everything a
step allocates on top, window by window (``traced.replay``). For a stage:

    forward/backward peak = W + O (+ G when accumulating) + max(replayed candidates at b)
                            + ZeRO-3 working set + buffers
    optimizer-step peak   = W + G + O + t_opt * (optimizer-shard parameters) + the batch

Refused by name: a profile traced from a model with another parameter count than the one
estimated (it describes another model), and a recompute level the profile does not hold.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dssup.errors import ConfigError
from dssup.memory.config import Layout, Precision, Training
from dssup.memory.profile import EagerProfile
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import Candidate, ReplayStage, TracedProfile, replay

__all__ = [
    "TracedStage",
    "check_profile",
    "stored_terms",
    "traced_assumptions",
    "traced_stage",
    "without_untraced_mtp",
]

_GRAD_BYTES = {"fp32": 4, "amp": 4, "bf16": 2}
_TOLERANCE = 0.005  # parameter totals must agree within 0.5 %


@dataclass(frozen=True, slots=True)
class TracedStage:
    """A stage's replay at in-flight 1, and what one more in-flight micro-batch keeps."""

    candidates: tuple[Candidate, ...]
    stored: tuple[float, float]  # (constant, per-sample) bytes per extra in-flight micro-batch
    inputs: tuple[float, float]  # the batch (alive in the optimizer step too)

    def forward_backward(self, b: int, in_flight: int) -> tuple[int, str]:
        """(bytes over the stage's states, window) of the highest candidate."""
        best = max(self.candidates, key=lambda c: c.at(b))
        extra = max(in_flight - 1, 0) * (self.stored[0] + self.stored[1] * b)
        return best.at(b) + math.ceil(extra), best.where

    def batch(self, b: int) -> int:
        return math.ceil(self.inputs[0] + self.inputs[1] * b)


def check_profile(p: TracedProfile, model_params: int, recompute: str) -> None:
    """Refuse a profile of another model, or without the recompute level asked for."""
    traced = p.stage_parameters + sum(
        n * p.levels[next(iter(p.levels))].kinds[k].parameters for k, n in p.blocks.items()
    )
    if abs(traced - model_params) > _TOLERANCE * model_params:
        raise ConfigError(
            "--calibration",
            f"the profile was traced from a model of {traced:,} parameters ({p.provenance.model})"
            f" but the model estimated has {model_params:,}",
            "calibrate the model you estimate",
        )
    if recompute not in p.levels:
        raise ConfigError(
            "--recompute",
            f"{recompute} is not in the profile (traced: {', '.join(p.levels)})",
            f"use one of {', '.join(p.levels)}, or calibrate that level",
        )


def _order(p: TracedProfile, dense: int, moe: int) -> tuple[tuple[str, int], ...]:
    """The stage's blocks in model order: dense first (the first-k dense layers), then MoE."""
    kinds = p.levels[next(iter(p.levels))].kinds
    out = []
    for kind, n in (("dense", dense), ("moe", moe)):
        if n:
            if kind not in kinds:
                raise ConfigError(
                    "--calibration",
                    f"the stage holds {kind} layers but the profile traced none",
                    "calibrate the model you estimate",
                )
            out.append((kind, n))
    return tuple(out)


def traced_stage(
    p: TracedProfile,
    layout: Layout,
    t: Training,
    dense: int,
    moe: int,
    first: bool,
    last: bool,
    device_grads: int,
) -> TracedStage:
    """Replay one stage (``device_grads``: the memory model's gradient bytes of the stage)."""
    lv = p.levels[t.recompute]
    g = _GRAD_BYTES.get(p.dtype, 4)
    traced = sum(n * lv.kinds[k].parameters for k, n in _order(p, dense, moe))
    if first or last:
        traced += p.stage_parameters // (1 if first and last else 2)
    scale = device_grads / (traced * g) if traced else 1.0
    st = ReplayStage(
        order=_order(p, dense, moe),
        first=first,
        last=last,
        s=t.seq_len // layout.cp,
        s_keys=t.seq_len,
        per_sample_divisor=layout.tp if layout.sp else 1,
        grad_scale=scale,
        accumulate=t.grad_accum > 1,
        in_flight=1,
        imbalance=t.moe_imbalance,
    )
    cands = replay(p, t.recompute, st)
    two = replay(p, t.recompute, dataclasses.replace(st, in_flight=2))
    # one more micro-batch in flight shifts every candidate by the same stored bytes
    stored = (two[0].base - cands[0].base, two[0].slope - cands[0].slope)
    inputs = lv.inputs
    s, k = st.s, st.s_keys
    return TracedStage(
        tuple(cands),
        stored,
        (inputs.constant.at(s, k), inputs.per_sample.at(s, k) / st.per_sample_divisor),
    )


def stored_terms(
    p: TracedProfile, dense: int, moe: int, s: int, s_keys: int, divisor: int
) -> list[tuple[str, str, int]]:
    """Per-sample bytes the stage's blocks keep from forward to backward, per kind and level,
    as (name, ``eager:<level>`` group, bytes): the activation terms a report lists."""
    out = []
    for level, lv in p.levels.items():
        for kind, n in (("dense", dense), ("moe", moe)):
            if n and kind in lv.kinds:
                per = lv.kinds[kind].forward.end.per_sample.at(s, s_keys) / divisor
                out.append((f"traced.{kind}_layers", f"eager:{level}", math.ceil(per * n)))
    return out


# (weights, gradients, master, moments) bytes of the step each profile dtype traces
_TRACED_STATES = {"fp32": (4, 4, 0, 4), "bf16": (2, 2, 0, 2), "amp": (4, 4, 0, 4)}
_DTYPE = {4: "fp32", 2: "bf16", 0: "none"}


def _precision_note(p: TracedProfile, precision: Precision | None) -> list[str]:
    """A line when the estimate counts model states at another precision than the trace's."""
    traced = _TRACED_STATES.get(p.dtype)
    if precision is None or traced is None:
        return []
    counted = (precision.weights, precision.gradients, precision.master, precision.moments)
    if counted == traced:
        return []
    w, g, ms, mo = traced
    flag = f"weights={_DTYPE[w]},grads={_DTYPE[g]},master={_DTYPE[ms]},moments={_DTYPE[mo]}"
    return [
        f"model states counted at the estimate's precision (weights {counted[0]} B, gradients "
        f"{counted[1]} B, master {counted[2]} B, moments 2 x {counted[3]} B per parameter), not "
        f"at the traced {p.dtype} step's ({w}, {g}, {ms}, 2 x {mo} B); --dtypes {flag} counts "
        "what was traced"
    ]


def traced_assumptions(
    p: TracedProfile,
    m: ModelSpec,
    layout: Layout,
    t: Training,
    precision: Precision | None = None,
) -> list[str]:
    """What was traced and what is modelled, for the estimate's assumptions list."""
    v = p.provenance
    blocks = " + ".join(f"{n} {k}" for k, n in p.blocks.items())
    out = [
        f"traced ({p.source}; micro-batches {', '.join(map(str, v.micro_batches))} x lengths "
        f"{', '.join(map(str, v.seq_lens))}, check {v.check_seq_len}): every window of the "
        f"step on one device -- embedding, each block's forward and backward, head and loss, "
        f"optimizer temporaries -- replayed over each stage's blocks ({blocks} in the model)",
        "modelled: weights, gradients and optimizer states with TP/EP splitting, ZeRO and "
        "offload (the memory model); the traced windows' gradient bytes scaled to that sharding",
        *_precision_note(p, precision),
    ]
    if layout.tp > 1:
        out.append(
            f"modelled: per-sample traced bytes / TP={layout.tp} (sequence parallelism)"
            if layout.sp
            else f"modelled: per-sample traced bytes not divided by TP={layout.tp} (no sequence "
            "parallelism): an upper bound"
        )
    if layout.cp > 1:
        out.append(
            f"modelled: per-token traced bytes at s/CP = {t.seq_len // layout.cp} tokens, "
            f"attention scores (s/CP) x s"
        )
    if t.moe_imbalance > 1 and "moe" in p.blocks:
        share = p.levels[t.recompute].kinds["moe"].forward.routed
        out.append(
            f"modelled: routed-expert bytes ({share:.0%} of an MoE block's stored bytes) x "
            f"imbalance {t.moe_imbalance:g}"
        )
    if layout.pp > 1:
        out.append(
            "modelled: each in-flight micro-batch holds its blocks' stored bytes; a later "
            "stage's received activation is counted as the embedding window's output"
        )
    if layout.pp > 1 and layout.schedule in ("dualpipe", "interleaved"):
        out.append(
            f"modelled: a rank holding several stages ({layout.schedule}) is replayed as one "
            "stage with all their blocks, at the largest in-flight count of any: an upper bound"
        )
    if t.seq_len > p.seq_len:
        out.append(
            f"sequence {t.seq_len} beyond the longest traced ({p.seq_len}): per-sample bytes "
            "extrapolated (degree 2 in the length)"
        )
    if t.micro_batch < min(v.micro_batches):
        out.append(
            f"micro-batch {t.micro_batch} below the traced ({min(v.micro_batches)}): "
            "extrapolated; at 1 PyTorch may copy where a size-1 dimension allowed a view"
        )
    return out


def without_untraced_mtp(m: ModelSpec, p: TracedProfile) -> tuple[ModelSpec, list[str]]:
    """The model as the traced code builds it: no MTP modules when the trace found none."""
    if not m.mtp_depth or p.mtp_modules:
        return m, []
    note = (
        f"MTP: the traced code builds none; the config's {m.mtp_depth} MTP module(s) are not "
        "counted"
    )
    return m.model_copy(update={"mtp_depth": 0}), [note]


def profile_from_json(
    doc: object, where: str, field: str = "--calibration"
) -> EagerProfile | TracedProfile:
    """A profile from its parsed JSON (files, ConfigMaps), refused by name if unknown;
    ``field`` is what the error names (a flag, an annotation)."""
    if not isinstance(doc, dict):
        raise ConfigError(field, f"{where} is not a calibration profile", "")
    version = doc.get("version", 1)
    if not isinstance(version, int) or version > 2:
        raise ConfigError(
            field,
            f"{where} has profile format {version!r}; this dssup reads formats 1 and 2",
            "upgrade dssup, or calibrate again with this one",
        )
    try:
        if doc.get("kind") == "traced":
            return TracedProfile.model_validate(doc)
        return EagerProfile.model_validate(doc)
    except ValueError as exc:
        raise ConfigError(
            field,
            f"{where} is not a valid {doc.get('kind', 'eager')} profile "
            f"({str(exc).splitlines()[0]})",
            "pass the JSON written by `dssup calibrate`",
        ) from exc
