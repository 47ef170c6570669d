"""The ``dssup.io/`` annotation contract: what a job may declare and what the webhook writes.

Inputs (explicit beats inferred; every one optional):

=================================  ===========================================================
``dssup.io/model``                 preset name (``deepseek-v3``) or ``configmap:<name>/<key>``
                                   holding a Hugging Face config.json in the job's namespace
``dssup.io/layout``                ``tp=1,pp=16,ep=64,etp=1,cp=1,vpp=1,sp=true`` (any subset)
``dssup.io/micro-batch-size``      sequences per micro-batch per data-parallel rank
``dssup.io/global-batch-size``     sequences per optimizer step (kept exact when resizing)
``dssup.io/seq-length``            tokens per sequence
``dssup.io/recompute``             ``none`` | ``selective`` | ``full``
``dssup.io/zero-stage``            ``0`` - ``3``
``dssup.io/offload``               ``none`` | ``optimizer`` | ``optimizer,params``
``dssup.io/precision``             ``bf16`` | ``fp16`` | ``bf16-lowmom`` | ``fp32``
``dssup.io/resize``                ``false`` forbids the mutating webhook to change the job
``dssup.io/max-gpus``              the job may grow to this many GPUs (more data-parallel
                                   replicas) when no config fits at its requested size
``dssup.io/calibration``           ``configmap:<name>/<key>`` holding the job's profile from
                                   ``dssup calibrate`` (its own model code's bytes)
=================================  ===========================================================

Outputs (written by the mutating webhook; JSON values):

``dssup.io/estimate``  ``{"peakGiB", "usableGiB", "gpu", "fits"}`` of the admitted config;
``dssup.io/resized-from`` / ``dssup.io/resized-to``  the knobs before and after a resize.
"""

from __future__ import annotations

from dssup.errors import ConfigError

__all__ = [
    "ESTIMATE",
    "GLOBAL_BATCH",
    "LAYOUT",
    "MAX_GPUS",
    "MICRO_BATCH",
    "MODEL",
    "OFFLOAD",
    "PRECISION",
    "PREFIX",
    "RECOMPUTE",
    "RESIZE",
    "RESIZED_FROM",
    "RESIZED_TO",
    "SEQ_LENGTH",
    "ZERO_STAGE",
    "parse_layout",
]

PREFIX = "dssup.io/"
MODEL = PREFIX + "model"
LAYOUT = PREFIX + "layout"
MICRO_BATCH = PREFIX + "micro-batch-size"
GLOBAL_BATCH = PREFIX + "global-batch-size"
SEQ_LENGTH = PREFIX + "seq-length"
RECOMPUTE = PREFIX + "recompute"
ZERO_STAGE = PREFIX + "zero-stage"
OFFLOAD = PREFIX + "offload"
PRECISION = PREFIX + "precision"
RESIZE = PREFIX + "resize"
MAX_GPUS = PREFIX + "max-gpus"
ESTIMATE = PREFIX + "estimate"
RESIZED_FROM = PREFIX + "resized-from"
RESIZED_TO = PREFIX + "resized-to"

_LAYOUT_KEYS = frozenset({"tp", "pp", "ep", "etp", "cp", "vpp", "sp"})


def parse_layout(text: str) -> dict[str, int | bool]:
    """``"tp=2,pp=16"`` -> ``{"tp": 2, "pp": 16}``; raise ``ConfigError`` naming the bad part."""
    out: dict[str, int | bool] = {}
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or key not in _LAYOUT_KEYS:
            raise ConfigError(
                LAYOUT,
                f"cannot read {part!r}",
                f"write key=value pairs with keys {', '.join(sorted(_LAYOUT_KEYS))}",
            )
        if key == "sp":
            out[key] = value.lower() in {"1", "true", "yes", "on"}
        elif value.isascii() and value.isdigit() and int(value) >= 1:
            out[key] = int(value)
        else:
            raise ConfigError(LAYOUT, f"{key}={value!r} is not a positive integer", "use e.g. tp=2")
    return out
