"""AdmissionReview bytes in, AdmissionReview bytes out: the policy behind the HTTP layer.

The documented rule for bad input (docs/admission.md): a body that is not a JSON
AdmissionReview v1 with a ``request.uid`` gets HTTP 400 (no valid answer can name the request);
anything else gets HTTP 200 with an AdmissionReview. Objects the policy cannot read are allowed
with a warning, and an unexpected exception inside the policy is logged and answered as an
allowed ``internal-error`` (fail open), so the webhook never answers 5xx.
"""

from __future__ import annotations

import json
import logging
import time

from dssup.admission.decision import Decision
from dssup.admission.policy import Mode, Policy
from dssup.admission.wire import AdmissionRequest, dumps, parse_review, response_document
from dssup.errors import MalformedReview
from dssup.obs.metrics import Metrics, NullMetrics

__all__ = ["Adapter"]

log = logging.getLogger(__name__)

KEEP_BODY_MAX = 1 << 16  # a parsed request kept for ``tidy`` comes from a body this size at most


class Adapter:
    """Turns request bodies into response bodies; records metrics and one log line per denial."""

    def __init__(self, policy: Policy, metrics: Metrics | None = None) -> None:
        self.policy = policy
        self.metrics: Metrics = metrics or NullMetrics()

    def decide(self, req: AdmissionRequest, mode: Mode) -> Decision:
        try:
            return self.policy.review(req, mode)
        except Exception:  # fail open: never a 5xx, never a crash (logged with the traceback)
            log.exception("policy failed", extra={"uid": req.uid, "kind": req.kind})
            return Decision(
                allowed=True,
                code="internal-error",
                message="dssup failed; allowed",
                warnings=("dssup: internal error while judging; allowed",),
            )

    def handle(
        self, mode: Mode, body: bytes, parsed: list[AdmissionRequest] | None = None
    ) -> tuple[int, bytes]:
        """(HTTP status, response body) for one POST. ``parsed`` receives the request once it
        is read (a caller waiting with a deadline can then answer for it)."""
        start = time.perf_counter()
        try:
            req = parse_review(body)
        except MalformedReview as exc:
            self.metrics.admission_request(
                "", "error", "malformed-review", time.perf_counter() - start
            )
            return 400, json.dumps({"error": str(exc)}).encode()
        if parsed is not None:
            parsed.append(req)
        decision = self.decide(req, mode)
        try:
            out = self._encode(req, decision, mode, start)
        except Exception:  # never a 5xx: answer a plain allow and log why
            log.exception("answering failed", extra={"uid": req.uid})
            out = dumps(response_document(req.uid, True))
        if len(body) <= KEEP_BODY_MAX:
            self.policy.leftovers.keep(req)  # freed by ``tidy``, once the answer is on its way
        return 200, out

    def fail_open(self, req: AdmissionRequest, mode: Mode, seconds: float) -> bytes:
        """The answer for a request not judged within ``seconds``: allowed, with a warning."""
        warning = f"dssup: not judged within {seconds:g} s (a very large object); allowed"
        decision = Decision(
            allowed=True, code="deadline-exceeded", message=warning, warnings=(warning,)
        )
        log.warning("judgement over the deadline", extra={"uid": req.uid, "kind": req.kind})
        return self._encode(req, decision, mode, time.perf_counter())

    def tidy(self) -> None:
        """Free what the answers so far left behind (their parsed requests, evicted memo
        entries). The server calls it once an answer is written; others need not call it."""
        self.policy.leftovers.release()

    def _encode(self, req: AdmissionRequest, decision: Decision, mode: Mode, start: float) -> bytes:
        doc = response_document(
            req.uid,
            decision.allowed,
            patch=decision.patch if mode == "mutate" else (),
            warnings=decision.warnings,
            code=403,
            message=decision.message,
            audit=decision.audit,
        )
        out = dumps(doc)
        patched = decision.allowed and bool(decision.patch) and mode == "mutate"
        verdict = "denied" if not decision.allowed else "patched" if patched else "allowed"
        self.metrics.admission_request(
            req.kind, verdict, decision.code, time.perf_counter() - start
        )
        if not decision.allowed or decision.code in {"resized", "internal-error"}:
            log.info(
                "%s %s %s/%s: %s",
                verdict,
                req.kind,
                req.namespace,
                req.name,
                decision.message,
                extra={
                    "uid": req.uid,
                    "namespace": req.namespace,
                    "object_name": req.name,
                    "kind": req.kind,
                    "operation": req.operation,
                    "decision": verdict,
                    "code": decision.code,
                    "dry_run": req.dry_run,
                    "mode": mode,
                },
            )
        return out
