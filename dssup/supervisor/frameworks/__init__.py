"""How each kind of training script receives dssup's plan: one module per framework.

``detect`` picks the first framework whose evidence is found (Hugging Face ``Trainer``/TRL,
Megatron, ``LightningCLI``, an ``accelerate`` loop), else the plain-script rules. Adding a
framework (torchtitan, say) is one module with a ``Framework`` object and its tests, plus a
line in ``FRAMEWORKS``.
"""

from __future__ import annotations

from dssup.supervisor.frameworks.accelerate import ACCELERATE_LOOP
from dssup.supervisor.frameworks.base import (
    KNOBS,
    Channel,
    Completion,
    Framework,
    Job,
    ScriptSource,
    read_source,
)
from dssup.supervisor.frameworks.hf import HF
from dssup.supervisor.frameworks.lightning import LIGHTNING
from dssup.supervisor.frameworks.megatron import MEGATRON
from dssup.supervisor.frameworks.plain import PLAIN

__all__ = [
    "FRAMEWORKS",
    "KNOBS",
    "Channel",
    "Completion",
    "Framework",
    "Job",
    "ScriptSource",
    "detect",
    "read_source",
]

FRAMEWORKS: tuple[Framework, ...] = (HF, MEGATRON, LIGHTNING, ACCELERATE_LOOP)


def detect(job: Job) -> tuple[Framework, str]:
    """The script's framework and the evidence for it (plain when nothing else fits)."""
    for framework in FRAMEWORKS:
        evidence = framework.detect(job)
        if evidence:
            return framework, evidence
    return PLAIN, PLAIN.detect(job) or ""
