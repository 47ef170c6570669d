"""One error tree for all of dssup, so callers can catch exactly what they mean.

Failures that are part of normal operation (a job that OOMs, a denied admission) are *data*
(``Failure``, ``Decision``), not exceptions. Exceptions are for misuse and for giving up::

    DssupError
    ├── ConfigError            bad user input: names the field and the fix (CLI exit 2)
    │   ├── UnknownPreset      a model preset name that does not exist
    │   └── UnknownModelType   a config.json whose model_type dssup does not read exactly
    ├── EstimateError          a valid config the memory model cannot evaluate
    ├── NoFeasiblePlan         the planner found no config that fits
    ├── LaunchError            the child command could not be started (CLI exit 126/127)
    ├── RetriesExhausted       the supervisor gave up; carries the last failure
    ├── JournalError           a run journal that cannot be read or continued
    └── MalformedReview        an AdmissionReview that cannot be parsed (HTTP 400)

This module imports only the standard library so that every layer, the pure memory model
included, can raise these.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DssupError",
    "EstimateError",
    "JournalError",
    "LaunchError",
    "MalformedReview",
    "NoFeasiblePlan",
    "RetriesExhausted",
    "UnknownModelType",
    "UnknownPreset",
]


class DssupError(Exception):
    """Root of every exception dssup raises on purpose."""


class ConfigError(DssupError, ValueError):
    """Bad input. ``field`` is the dotted path or flag; ``fix`` says what to do instead."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f"; {fix}"
        super().__init__(text)


class UnknownPreset(ConfigError):
    """A model preset name that dssup does not ship."""


class UnknownModelType(ConfigError):
    """A config whose architecture dssup cannot read exactly (unknown ``model_type``, a config
    format that is not Hugging Face's): the model cannot be judged, it is not a wrong value."""


class EstimateError(DssupError):
    """A config that passed validation but cannot be estimated."""


class NoFeasiblePlan(DssupError):
    """No config within the search space fits the GPU; ``closest`` describes the best miss."""

    def __init__(self, message: str, closest: object | None = None) -> None:
        self.closest = closest
        super().__init__(message)


class LaunchError(DssupError):
    """The child command could not be started. ``exit_code`` is 126 or 127 (shell rules)."""

    def __init__(self, message: str, exit_code: int = 126) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class RetriesExhausted(DssupError):
    """The supervisor stopped retrying; ``last_failure`` is the final failure record."""

    def __init__(self, message: str, last_failure: object | None = None) -> None:
        self.last_failure = last_failure
        super().__init__(message)


class JournalError(DssupError):
    """A run directory whose journal is unreadable or belongs to another command."""


class MalformedReview(DssupError):
    """An AdmissionReview request that is not valid JSON or lacks required fields."""
