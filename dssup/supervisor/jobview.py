"""The supervisor's view of the job it runs: launcher, framework, hand-off, and what they say.

One object answers the questions the run loop asks about *this* script: which remedies it can
receive and whether a proposed plan is the same run as one that already failed (the
hand-off), how to write its arguments for a plan and a checkpoint, what its framework printed
about the batch it really used, and whether its framework says training finished. It also
writes the sentences the console shows: the hand-off before attempt 1, and for each attempt
the plan and where it resumes from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dssup.jobreport import Completed, ReportRecord, read_report
from dssup.supervisor.adapters import Objection
from dssup.supervisor.checkpoints import CheckpointRef, unrecognised
from dssup.supervisor.frameworks import Channel, Completion, Framework, Job
from dssup.supervisor.handoff import HandOff
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.report import report_path

__all__ = ["JobView"]

_OUTPUT_LIMIT = 8 << 20  # bytes of rank 0's output read after an attempt
# plan knob -> the DSSUP_* variable read_plan takes it from (dssup.runtime.plan._KNOB_VARS)
_ENV = {
    "micro_batch": "DSSUP_MICRO_BATCH_SIZE",
    "grad_accum": "DSSUP_GRAD_ACCUM_STEPS",
    "recompute": "DSSUP_RECOMPUTE",
    "zero_stage": "DSSUP_ZERO_STAGE",
    "offload": "DSSUP_OFFLOAD",
    "resume": "DSSUP_RESUME_FROM",
}


@dataclass
class JobView:
    handoff: HandOff
    job: Job
    framework: Framework
    adapters: Sequence[Any] = ()  # adapters with a ``reported(text)`` read their prints too

    # --- choosing remedies ---------------------------------------------------------------
    @property
    def capabilities(self) -> frozenset[str]:
        """What a remedy may change: knobs the script receives (adapters' channels included)."""
        return self.handoff.capabilities

    def check(
        self, current: TrainingPlan, failed: set[str]
    ) -> Callable[[TrainingPlan], Objection | None]:
        """The hand-off's objection to a proposed plan, given the configs that failed."""
        seen = {self.handoff.fingerprint(TrainingPlan.model_validate_json(k)) for k in failed}

        def objection(new: TrainingPlan) -> Objection | None:
            refused = self.handoff.refusal(current, new)
            if refused:
                return Objection(refused, unreachable=True)
            if self.handoff.fingerprint(new) in seen:
                return Objection(
                    "the script would receive exactly what it received in a config that already "
                    "failed (its framework cannot tell these settings apart): not relaunched"
                )
            return None

        return objection

    def learn(self, records: Sequence[dict[str, Any]]) -> list[str]:
        """Knobs the job's own report shows it takes from the environment (``env_knobs`` of
        its ``started`` records, written by ``read_plan``) become received by the environment:
        evidence stronger than its source (a wrapper script, a module it loads). Returns the
        knobs newly received."""
        taken = {k for r in records if r.get("type") == "started" for k in r.get("env_knobs") or ()}
        channels, learned = dict(self.handoff.channels), []
        for knob in sorted(taken & set(_ENV)):
            if not channels.get(knob, Channel(knob=knob, via="none")).receives:
                channels[knob] = Channel(knob=knob, via="env", name=_ENV[knob],
                                         evidence="the job's report says read_plan took it")  # fmt: skip
                learned.append(knob)
        if learned:
            self.handoff = self.handoff.model_copy(update={"channels": channels})
        return learned

    # --- one attempt ---------------------------------------------------------------------
    def render(
        self, plan: TrainingPlan, args: list[str], resume: CheckpointRef | None
    ) -> tuple[list[str], dict[str, str]]:
        return (
            self.framework.render(plan, self.job, args, resume),
            self.framework.environment(plan, self.job),
        )

    def attempt_line(self, number: int, plan: TrainingPlan, resume: CheckpointRef | None) -> str:
        head = f"attempt {number}: {plan.describe()}"
        if resume is None:
            return f"{head}; from scratch (no complete checkpoint yet)"
        how = self.handoff.channels["resume"]
        via = how.name if how.receives else f"not received ({how.evidence})"
        return f"{head}; resuming from {resume.path} (step {resume.step}) via {via}"

    def checkpoint_hint(self, root: Path | None, pattern: str | None) -> str | None:
        return unrecognised(root, pattern)

    # --- after an attempt ----------------------------------------------------------------
    @staticmethod
    def output(path: Path | None) -> str:
        if path is None:
            return ""
        try:
            with open(path, "rb") as fh:
                return fh.read(_OUTPUT_LIMIT).decode(errors="replace")
        except OSError:
            return ""

    def reported(self, output: str) -> list[ReportRecord]:
        """What the framework (HF Trainer's block, Megatron's arguments) and the adapters
        (DeepSpeed's engine configuration) printed about the batch on rank 0."""
        found = list(self.framework.reported(output))
        for adapter in self.adapters:
            method = getattr(adapter, "reported", None)
            if callable(method):
                found += method(output)
        return found

    def finished(
        self, failure: Failure | None, started: float, output: str, attempt_dir: Path | None = None
    ) -> Failure | None:
        """``failure`` re-read when training had finished: a ``teardown`` when the script's
        final save is seen whole and the failure is no exception of the script's own (an
        abort or a signal at exit), else ``unverified-end`` (trained; not to be trained
        again; not a success). The framework's own signs come first; then the job-side report's
        end-of-training records (``final=False``, a Trainer callback's ``on_train_end``)."""
        if failure is None or failure.kind in {
            FailureKind.INTERRUPTED,
            FailureKind.TEARDOWN,
            FailureKind.UNVERIFIED_END,
            FailureKind.BATCH_MISMATCH,
        }:
            return failure
        done = self.framework.completed(self.job, started, output) or _loop_ended(attempt_dir)
        if done is None:
            return failure
        then = f"then {failure.kind}: {failure.message}"
        common = {"exit_code": failure.exit_code, "rank": failure.rank,
                  "signature": failure.signature, "ranks": failure.ranks}  # fmt: skip
        trained = f"{self.framework.name}: {done.training}"
        raised = _raised(failure)
        if done.saved is not None and raised is None:
            return Failure(kind=FailureKind.TEARDOWN, **common,
                           message=f"training had completed; {then}",
                           evidence=(*failure.evidence, trained, f"final save: {done.saved}"))  # fmt: skip
        if done.saved is not None:  # the script's own exception after its save: not a flake
            return Failure(
                kind=FailureKind.UNVERIFIED_END, **common,
                message=f"training had completed and its final save is whole, but the script then raised; {then}",
                evidence=(*failure.evidence, trained, f"final save: {done.saved}",
                          f"what follows the final save is unverified: {raised}"),
            )  # fmt: skip
        return Failure(
            kind=FailureKind.UNVERIFIED_END, **common,
            message=f"training had completed, but its final save is unverified; {then}",
            evidence=(*failure.evidence, trained, f"final save unverified: {done.unverified}"),
        )  # fmt: skip


_RAISED = frozenset({"uncaught-traceback", "error-file"})


def _raised(failure: Failure) -> str | None:
    """How the root-cause rank shows a Python exception out of the script, or None (a signal,
    an abort at exit: the teardown flakes)."""
    root = [r for r in failure.ranks if r.rank == failure.rank and not r.cascade]
    seen = sorted(_RAISED & {s for r in root for s in r.sources})
    if seen:
        return f"rank {failure.rank}'s {' and '.join(seen)} show an exception out of the script"
    if failure.kind == FailureKind.USER_ERROR:
        return f"rank {failure.rank} failed with {failure.signature or 'a user error'}"
    return None


def _loop_ended(attempt_dir: Path | None) -> Completion | None:
    """The job-side report's end-of-training records (not the script's end), if any."""
    if attempt_dir is None:
        return None
    ended = sorted({r.rank for r in read_report(report_path(attempt_dir)).of(Completed)
                    if not r.final})  # fmt: skip
    if not ended:
        return None
    return Completion(
        training=f"rank(s) {ended} reported the end of the training loop (on_train_end)",
        unverified="the script did not report its own end (dssup.runtime.clean_exit() or "
        "mark_done() after its final save says so)",
    )
