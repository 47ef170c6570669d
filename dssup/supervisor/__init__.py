"""The OOM-recovering supervisor: ``dssup run -- torchrun ...`` as a library.

It runs torchrun as a child, reads every trace a failed attempt leaves (error files, stderr,
exit codes and signals, cgroup OOM-kill counters), decides what went wrong, picks the cheapest
change that should fit (keeping the global batch exact), and relaunches from the latest
complete checkpoint, journalling everything so that a killed supervisor can continue the run.
It never imports torch: the training-side half is ``dssup.runtime``.
"""

from dssup.supervisor.adapters import AppliedPlan, PlanAdapter, RemedyContext, RemedyStep
from dssup.supervisor.checkpoints import CheckpointRef, find_latest
from dssup.supervisor.classify import classify
from dssup.supervisor.command import LaunchCommand, parse_command
from dssup.supervisor.config import SupervisorConfig
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, RankFailure, Remedy, TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner
from dssup.supervisor.supervisor import RunOutcome, Supervisor

__all__ = [
    "AppliedPlan",
    "CheckpointRef",
    "Failure",
    "FailureKind",
    "Journal",
    "LaunchCommand",
    "PlanAdapter",
    "RankFailure",
    "Remedy",
    "RemedyContext",
    "RemedyPlanner",
    "RemedyStep",
    "RunOutcome",
    "Supervisor",
    "SupervisorConfig",
    "TrainingPlan",
    "classify",
    "find_latest",
    "parse_command",
]
