"""Training-side helper: what a ``train.py`` imports to follow the plan ``dssup run`` hands it.

The supervisor never imports this package (an import-linter contract keeps it that way): it is
the only part of dssup that touches torch, and it runs inside the training workers. It reads the
environment contract (``DSSUP_MICRO_BATCH_SIZE``, ``DSSUP_RESUME_FROM``, ...), can cap a worker's
address space so that a CPU job fails with a real allocator error (the CPU stand-in for a CUDA
OOM), saves and restores torch DCP checkpoints exactly (optimizer moments included), and ends a
worker cleanly so that torchrun does not report a teardown abort as a failure, and reports
what the job really trains with (``report_started`` ..., or ``dssup.runtime.hf.DssupCallback``
for Hugging Face ``Trainer``), so the supervisor verifies the global batch instead of assuming it.
"""

from dssup.runtime.plan import RuntimePlan, read_plan
from dssup.runtime.process import clean_exit, mark_done, memory_cap
from dssup.runtime.report import (
    report_batch_changed,
    report_checkpoint,
    report_completed,
    report_started,
)

__all__ = [
    "RuntimePlan",
    "clean_exit",
    "mark_done",
    "memory_cap",
    "read_plan",
    "report_batch_changed",
    "report_checkpoint",
    "report_completed",
    "report_started",
]
