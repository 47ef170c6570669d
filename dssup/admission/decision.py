"""The policy's answer as data: allowed or not, a stable code, a message, warnings, a patch.

Codes are stable kebab-case slugs; dashboards, tests and users' scripts match on them, so they
are only ever added. ``DENY_CODES`` may refuse a job (in enforcing namespaces); every other code
is an allowed answer, possibly with warnings.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CODES", "DENY_CODES", "Decision"]

CODES: dict[str, str] = {
    "fits": "the predicted per-GPU peak fits the requested GPU",
    "resized": "the job did not fit; the mutating webhook changed it to the cheapest config that fits",
    "predicted-oom": "the predicted peak exceeds the GPU and a fitting config exists (named in the message)",
    "no-feasible-plan": "the predicted peak exceeds the GPU and no config in the search space fits",
    "predicted-host-oom": "the config fits the GPU but its offloaded states exceed the pod's memory limit (or the node's memory)",
    "invalid-config": "the stated config contradicts itself or the model (e.g. TP not dividing heads)",
    "config-incomplete": "the job does not state enough (model, sizes) to be judged; allowed",
    "cache-miss": "a ConfigMap or runtime the job refers to is not in the watch cache; allowed",
    "unknown-gpu": "no GPU product is requested or its memory is unknown; allowed",
    "not-applicable": "no GPUs, an operation or sub-resource that is not judged, or a controlled Pod",
    "unsupported-kind": "an object kind dssup does not read; allowed",
    "malformed-object": "the object is missing or not a JSON object; allowed",
    "internal-error": "dssup failed while judging; allowed (fail open) and logged",
    "deadline-exceeded": "not judged within the deadline (a very large object); allowed",
}
DENY_CODES = frozenset(
    {"predicted-oom", "no-feasible-plan", "predicted-host-oom", "invalid-config"}
)


class Decision(BaseModel):
    """One admission answer. ``patch`` is RFC 6902 and only ever non-empty when ``allowed``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    allowed: bool = Field(description="whether the object may be stored")
    code: str = Field(description="stable kebab-case reason, one of CODES")
    message: str = Field("", description="what was decided and, for a denial, what to change")
    warnings: tuple[str, ...] = Field((), description="shown by kubectl as 'Warning: ...'")
    patch: tuple[dict[str, Any], ...] = Field((), description="JSON Patch operations (mutate only)")
    audit: dict[str, str] = Field(default_factory=dict, description="auditAnnotations")
    breakdown: dict[str, Any] | None = Field(None, description="estimate summary for dssup admit")
