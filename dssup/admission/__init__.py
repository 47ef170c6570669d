"""Kubernetes admission: judge training jobs by predicted GPU memory at CREATE.

A pure policy (``Policy``: normalise the object, read its training config, find the GPU,
estimate, then allow / resize / deny) under an AdmissionReview v1 adapter (``Adapter``) served
by uvicorn over TLS (``server``). Cluster knowledge comes only from a ``ClusterCache`` (watch
caches in production, fixtures in tests and ``dssup admit``). See docs/admission.md.
"""

from dssup.admission.adapter import Adapter
from dssup.admission.cache import ClusterCache, InMemoryCache
from dssup.admission.decision import CODES, DENY_CODES, Decision
from dssup.admission.policy import Mode, Policy
from dssup.admission.settings import PolicySettings
from dssup.admission.wire import AdmissionRequest, parse_review, response_document

__all__ = [
    "CODES",
    "DENY_CODES",
    "Adapter",
    "AdmissionRequest",
    "ClusterCache",
    "Decision",
    "InMemoryCache",
    "Mode",
    "Policy",
    "PolicySettings",
    "parse_review",
    "response_document",
]
