"""The admission policy: allow, resize (mutate) or deny a job by its predicted GPU memory.

Pure with respect to the cluster: everything it knows comes from a ``ClusterCache``. Three
modes, one per webhook path: ``mutate`` (CREATE only; resizes a job that does not fit and
records the estimate; never denies), ``validate`` (enforcing namespaces; denies what does not
fit) and ``warn`` (other namespaces; the same judgement as warnings only). ``dryRun`` requests
are answered exactly like real ones: the policy has no side effects.

An UPDATE is denied only when it turns a fitting job into one that does not fit, so controllers
can still update (finalizers, labels) a job admitted before enforcement was switched on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from dssup.admission import annotations as ann
from dssup.admission.cache import ClusterCache
from dssup.admission.decision import Decision
from dssup.admission.evaluate import LRU, Evaluation, Evaluator, Leftovers
from dssup.admission.gpus import GpuMemory
from dssup.admission.hostcheck import HostVerdict, host_verdict
from dssup.admission.kinds import suspended
from dssup.admission.memo import Versioned, carries_written, content, memo_key
from dssup.admission.messages import breakdown, describe, estimate_note, gib, peak_terms, unseen
from dssup.admission.patch import annotation_ops
from dssup.admission.resize import Resize, find_resize
from dssup.admission.settings import PolicySettings
from dssup.admission.source import Incomplete
from dssup.admission.visible import pods_config, seen_knobs
from dssup.admission.wire import AdmissionRequest
from dssup.admission.writer import assumed_defaults
from dssup.errors import ConfigError
from dssup.memory import Estimate, Layout, Training
from dssup.memory.capacity import Band, near_words

__all__ = ["Mode", "Policy"]

Mode = Literal["mutate", "validate", "warn"]
T = TypeVar("T")
log = logging.getLogger(__name__)


def _assumed(obj: Mapping[str, Any], ev: Evaluation, cache: ClusterCache) -> tuple[str, ...]:
    """Knobs the judged config took from job annotations the pods do not see."""
    assumed = unseen(ev.cfg.origins, ev.view.kind)
    if not assumed:
        return ()
    try:
        seen = pods_config(obj, cache, ev.view.namespace)
    except (ConfigError, Incomplete):
        return assumed
    return unseen(ev.cfg.origins, ev.view.kind, seen_knobs(ev.cfg, seen))


def _estimate_note(ev: Evaluation, assumed: tuple[str, ...]) -> str:
    return estimate_note(ev.est.peak_bytes, ev.gpu, ev.cfg.training, ev.cfg.global_batch, assumed)


def _unseen_warning(assumed: tuple[str, ...]) -> tuple[str, ...]:
    if not assumed:
        return ()
    return (
        f"dssup: {', '.join(assumed)} taken from job annotations, which the pods do not see"[:120],
    )


def _host(ev: Evaluation) -> tuple[str, ...]:
    """The warning of a job whose host memory could not be checked (never a denial)."""
    host = host_verdict(ev.est, ev.view, ev.gpu.product)
    if host is None or host.fits is not None:
        return ()
    return (f"dssup: {host.words()}"[:240],)


def _fits_message(ev: Evaluation) -> str:
    host = host_verdict(ev.est, ev.view, ev.gpu.product)
    return (
        f"dssup: peak {gib(ev.est.peak_bytes)} GiB/GPU fits {ev.gpu.product} "
        f"({gib(ev.gpu.usable_bytes)} GiB usable)" + (f"; {host.words()}" if host else "")
    )


def _with_band(message: str, est: Estimate) -> str:
    """``message``, saying so when the peak is within the model's uncertainty of the limit."""
    band = _band(est)
    return message if band is None else f"{message}; {near_words(band)}"


def _band(est: Estimate) -> Band | None:
    """The memory model's uncertainty band when a fitting peak is within it of the limit."""
    if not est.near_limit or est.uncertainty is None:
        return None
    return Band(est.uncertainty, est.uncertainty_source)


def _near_warning(est: Estimate, gpu: GpuMemory) -> tuple[str, ...]:
    """The warning an answer carries when the peak fits within the band (never a denial)."""
    band = _band(est)
    if band is None:
        return ()
    return (
        f"dssup: near the limit: {gib(est.peak_bytes)} of {gib(gpu.usable_bytes)} GiB on "
        f"{gpu.product}, within the memory model's {band.fraction:.1%} uncertainty "
        f"({band.source})"[:256],
    )


def _capacity(ev: Evaluation) -> str:
    g = ev.gpu
    shared = f" shared by {g.shared_by}" if g.shared_by > 1 else ""
    reserve = g.cuda_bytes - g.usable_bytes
    kept = f" - {gib(reserve)} GiB reserve" if reserve else ""
    return (
        f"{gib(g.total_bytes)} GiB{shared} from {g.source}, {gib(g.cuda_bytes)} GiB of it CUDA "
        f"can allocate ({g.cuda_note}){kept}"
    )


class Policy:
    """Decides AdmissionRequests; one instance per process (it owns the estimate cache)."""

    def __init__(
        self, cache: ClusterCache, settings: PolicySettings | None = None, *, explain: bool = False
    ) -> None:
        self.settings = settings or PolicySettings()
        self.leftovers = Leftovers()  # what answers leave behind; ``Adapter.tidy`` frees it
        self.evaluator = Evaluator(cache, self.settings, self.leftovers)
        self.explain = explain  # attach the per-stage breakdown (dssup admit); off on the hot path
        self._generation = cache.generation if isinstance(cache, Versioned) else None
        size = self.settings.judgement_cache_size if self._generation else 0
        self._memo = LRU(size, self.leftovers)
        # What reads only a judged config, by its key: the answer to a fit outside mutate (per
        # mode) and the estimate annotation mutate writes.
        self._verdicts = LRU(size, self.leftovers)

    def cache_stats(self) -> dict[str, tuple[int, int, int]]:
        """(hits, misses, entries) of the decision, verdict, evaluation and estimate caches."""
        return {
            "decisions": self._memo.stats(),
            "verdicts": self._verdicts.stats(),
            **self.evaluator.cache_stats(),
        }

    def _breakdown(
        self, est: Estimate, layout: Layout, training: Training, ev: Evaluation
    ) -> dict[str, Any] | None:
        if not self.explain:
            return None
        return breakdown(est, layout, training, ev.gpu, ev.cfg.global_batch)

    def review(self, req: AdmissionRequest, mode: Mode) -> Decision:
        if req.operation not in ("CREATE", "UPDATE") or (
            mode == "mutate" and req.operation != "CREATE"
        ):
            return Decision(
                allowed=True, code="not-applicable", message=f"{req.operation} is not judged"
            )
        if req.sub_resource:
            return Decision(
                allowed=True, code="not-applicable", message="sub-resources are not judged"
            )
        if req.obj is None:
            return Decision(
                allowed=True,
                code="malformed-object",
                message="request.object is missing",
                warnings=("dssup: request.object is missing or not an object; allowed",),
            )
        decision = self.judge(req.obj, req.namespace, mode)
        if not decision.allowed and req.operation == "UPDATE" and req.old_obj is not None:
            if suspended(req.old_obj) and not suspended(req.obj):
                # Kueue admits a job by injecting its flavor's node selector and unsuspending
                # it: the GPU becomes known only now, after quota was reserved. Warn, never a
                # late denial that lands on Kueue's controller.
                return decision.model_copy(
                    update={
                        "allowed": True,
                        "warnings": (
                            decision.message[:240],
                            "dssup: allowed: the GPU became known when the job was unsuspended "
                            "(Kueue); dssup warns at unsuspend, it does not deny",
                        ),
                    }
                )
            before = self.judge(req.old_obj, req.namespace, mode)
            if not before.allowed:
                return decision.model_copy(
                    update={
                        "allowed": True,
                        "warnings": (
                            *decision.warnings,
                            "dssup: allowed: the job did not fit before this update either",
                        ),
                    }
                )
        return decision

    def judge(self, obj: Mapping[str, Any], namespace: str, mode: Mode) -> Decision:
        """Decide one object (the body of ``review``; also what ``dssup admit`` calls).

        Decisions are remembered by content (see ``memo.py``); a cache that cannot say when it
        changed (no ``generation``) turns the memory off. The content is also the evaluation's
        unless the mutating webhook meets annotations dssup wrote, so it is mostly serialised
        once."""
        if self._generation is None or self._memo.size <= 0:
            return self._judge(obj, namespace, mode, None)
        raw = content(obj, namespace, self._generation(), keep_written=mode == "mutate")
        if raw is None:
            return self._judge(obj, namespace, mode, None)
        # On a miss the evaluation shares ``raw``, unless the mutating webhook meets annotations
        # dssup wrote (the evaluation's content leaves them out).
        return self._memo.remember(
            memo_key(mode, raw),
            lambda: self._judge(
                obj, namespace, mode, None if mode == "mutate" and carries_written(obj) else raw
            ),
        )

    def _judge(
        self, obj: Mapping[str, Any], namespace: str, mode: Mode, raw: bytes | None
    ) -> Decision:
        try:
            # Only the mutating webhook keeps evaluations: the validating one comes after it.
            ev = self.evaluator.evaluate(obj, namespace, raw, keep=mode == "mutate")
        except ConfigError as exc:
            return self._refuse(
                mode, "invalid-config", f"dssup: invalid training config: {exc}", None
            )
        if isinstance(ev, Decision):
            return ev
        if not ev.est.fits:
            return self._does_not_fit(obj, ev, mode)
        host = host_verdict(ev.est, ev.view, ev.gpu.product)
        if host is not None and host.fits is False:
            return self._host_oom(ev, host, mode)
        if mode == "mutate":
            return self._fits_patch(obj, ev)
        # A fresh job of a known config (new name, new run id) gets the answer already built.
        return self._per_config(ev, mode, lambda: self._fits(obj, ev, mode))

    def _per_config(self, ev: Evaluation, what: str, make: Callable[[], T]) -> T:
        """``make()``, remembered as ``what`` under the evaluation's config key when it has one:
        for what reads only the judged config (a fit's answer per mode, the estimate note)."""
        if ev.key is None:
            return make()
        return self._verdicts.remember((what, ev.key), make)

    def _fits_patch(self, obj: Mapping[str, Any], ev: Evaluation) -> Decision:
        """The mutating webhook's answer to a fit: the estimate annotation (read from ``obj``:
        the patch adds to what it already holds)."""
        cache = self.evaluator.cache
        note = self._per_config(ev, "note", lambda: _estimate_note(ev, _assumed(obj, ev, cache)))
        ops = annotation_ops(obj, {ann.ESTIMATE: note})
        near = _near_warning(ev.est, ev.gpu)
        return self._fit(ev, _fits_message(ev), patch=tuple(ops), warnings=(*near, *_host(ev)))

    def _fits(self, obj: Mapping[str, Any], ev: Evaluation, mode: Mode) -> Decision:
        """The validating (or warning) answer to a fit: reads only the judged config (what the
        pods see of it is a function of the same launch lines and annotations)."""
        msg = _fits_message(ev)
        notes = tuple(f"dssup: {w}"[:120] for w in ev.cfg.warnings[:3])
        unseen_note = _unseen_warning(_assumed(obj, ev, self.evaluator.cache))
        near = _near_warning(ev.est, ev.gpu)
        host = _host(ev)
        return self._fit(ev, msg, warnings=(*notes, *unseen_note, *near, *host, msg[:120]))

    def _host_oom(self, ev: Evaluation, host: HostVerdict, mode: Mode) -> Decision:
        """Fits the GPU, not the host: the offloaded states pass the pod's memory limit."""
        message = (
            f"dssup: {host.words()} with {describe(ev.cfg.layout, ev.cfg.training)}; raise the "
            f"memory limit to at least {gib(host.need)} GiB, use nodes with more memory, or "
            "offload less"
        )
        bd = self._breakdown(ev.est, ev.cfg.layout, ev.cfg.training, ev)
        if mode == "mutate":
            return Decision(allowed=True, code="predicted-host-oom", message=message, breakdown=bd)
        short = (
            f"dssup: predicted host OOM: {gib(host.need)} GiB {host.where} > "
            f"{gib(host.limit or 0)} GiB ({host.source})"
        )
        return self._refuse(mode, "predicted-host-oom", message, bd, short=short)

    def _fit(self, ev: Evaluation, message: str, **answer: Any) -> Decision:
        """What every answer to a fit holds (message, audit, breakdown), plus ``answer``: the
        mutating webhook's patch or the warnings of the others."""
        return Decision(
            allowed=True,
            code="fits",
            message=_with_band(message, ev.est),
            audit={"estimate-gib": str(gib(ev.est.peak_bytes)), "decision": "fits"},
            breakdown=self._breakdown(ev.est, ev.cfg.layout, ev.cfg.training, ev),
            **answer,
        )

    def _does_not_fit(self, obj: Mapping[str, Any], ev: Evaluation, mode: Mode) -> Decision:
        guessed = assumed_defaults(ev.src, ev.cfg)
        if guessed:  # missing input is never a denial, nor a resize built on a guess
            what = ", ".join(guessed)
            warning = (
                f"dssup: not judged: predicted {gib(ev.est.peak_bytes)} GiB/GPU > "
                f"{gib(ev.gpu.usable_bytes)} GiB on {ev.gpu.product} only with assumed {what}; "
                "state them"
            )
            return Decision(
                allowed=True,
                code="config-incomplete",
                message=f"not judged: the job does not state {what} (assumed); {warning[7:]}",
                warnings=(warning[:240],),
                audit={"decision": "config-incomplete"},
            )
        resize = find_resize(obj, ev, self.evaluator, self.settings)
        if (
            mode == "mutate"
            and resize.patch is not None
            and ev.view.annotations.get(ann.RESIZE) != "false"
        ):
            return self._resized(ev, resize)
        head = (
            f"dssup: predicted peak {gib(ev.est.peak_bytes)} GiB/GPU on pipeline stage "
            f"{ev.est.peak_stage} ({peak_terms(ev.est)}) exceeds {ev.gpu.product} usable "
            f"{gib(ev.gpu.usable_bytes)} GiB ({_capacity(ev)}) with "
            f"{describe(ev.cfg.layout, ev.cfg.training)}"
        )
        code = "predicted-oom" if resize.candidate is not None else "no-feasible-plan"
        bd = self._breakdown(ev.est, ev.cfg.layout, ev.cfg.training, ev)
        if mode == "mutate":
            return Decision(
                allowed=True, code=code, message=f"{head}; {resize.advice}", breakdown=bd
            )
        return self._refuse(
            mode,
            code,
            f"{head}; {resize.advice}",
            bd,
            short=f"dssup: predicted OOM: {gib(ev.est.peak_bytes)} GiB/GPU > "
            f"{gib(ev.gpu.usable_bytes)} GiB on {ev.gpu.product}; {resize.short}",
        )

    def _resized(self, ev: Evaluation, resize: Resize) -> Decision:
        assert resize.patch is not None and resize.candidate is not None
        new = resize.candidate
        msg = (
            f"dssup: resized to fit {ev.gpu.product}: {describe(ev.cfg.layout, ev.cfg.training)} -> "
            f"{describe(new.layout, new.training)} (peak {gib(ev.est.peak_bytes)} -> "
            f"{gib(resize.peak_bytes)} GiB, global batch {ev.cfg.global_batch} kept)"
        )
        warn = (
            f"dssup: resized: {resize.short} to fit {ev.gpu.product} "
            f"({gib(resize.peak_bytes)}/{gib(ev.gpu.usable_bytes)} GiB)"
        )
        audit = {"estimate-gib": str(gib(resize.peak_bytes)), "decision": "resized"}
        bd = self._breakdown(resize.estimate, new.layout, new.training, ev)
        return Decision(
            allowed=True,
            code="resized",
            message=_with_band(msg, resize.estimate),
            warnings=(warn[:240], *_near_warning(resize.estimate, ev.gpu)),
            patch=tuple(resize.patch),
            audit=audit,
            breakdown=bd,
        )

    def _refuse(
        self,
        mode: Mode,
        code: str,
        message: str,
        bd: dict[str, Any] | None,
        short: str | None = None,
    ) -> Decision:
        if mode == "validate":
            return Decision(
                allowed=False, code=code, message=message, breakdown=bd, audit={"decision": code}
            )
        warning = (short or message)[:240]
        return Decision(
            allowed=True,
            code=code,
            message=message,
            breakdown=bd,
            warnings=(warning,) if mode == "warn" else (),
            audit={"decision": code},
        )
