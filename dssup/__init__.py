"""dssup: keeps large distributed training jobs from dying of GPU out-of-memory.

The public API is the memory model (estimate a config, plan one that fits) and the error tree;
the supervisor, the admission webhook and the CLI are reached through ``dssup`` commands.
"""

from dssup.errors import (
    ConfigError,
    DssupError,
    EstimateError,
    JournalError,
    LaunchError,
    MalformedReview,
    NoFeasiblePlan,
    RetriesExhausted,
    UnknownPreset,
)
from dssup.memory import (
    Estimate,
    Layout,
    ModelSpec,
    Overheads,
    PlanRequest,
    PlanResult,
    Precision,
    Training,
    estimate,
    plan,
    preset,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DssupError",
    "Estimate",
    "EstimateError",
    "JournalError",
    "LaunchError",
    "Layout",
    "MalformedReview",
    "ModelSpec",
    "NoFeasiblePlan",
    "Overheads",
    "PlanRequest",
    "PlanResult",
    "Precision",
    "RetriesExhausted",
    "Training",
    "UnknownPreset",
    "__version__",
    "estimate",
    "plan",
    "preset",
]
