"""``StepGuard``: one optimizer step that survives an OOM without a restart.

::

    guard = StepGuard(ddp_model, optimizer, global_batch=32, micro_batch=16)
    for step in range(start, steps):
        result = guard.step(share_of(step), lambda mb: loss_fn(ddp_model(mb.x), mb.y))

``step`` gets this rank's whole share of the step (``global_batch / dp`` samples, in order) and
a function that returns the loss of one micro-batch (a mean over its samples, or with
``loss_reduction="sum"`` a value already normalised independently of the split). It cuts the
share into ``micro_batch``-sample micro-batches, runs forward and backward for each with
gradient accumulation (``gradsync`` keeps the training's collectives out of every micro-batch
that may be redone), and asks every rank for its verdict on a side channel (``agree``). When
any rank ran out of memory, every rank takes the same decision: free what the failed try held,
zero the gradients, rewind the RNG, move to the next finer split of the *same* share (the
largest divisor at most half the micro-batch) and redo the step; the loss scaler is not
touched, the data is the same samples in the same order, so the global batch and the gradient
are exact. The new split persists, and an ``inprocess-remedy`` record tells the supervisor. When
no rank failed: gradients are synchronised, ``before_optimizer`` runs (clipping), then the
optimizer (and scaler) step. What cannot be redone goes to ``backstop.give_up``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dssup.errors import ConfigError
from dssup.jobreport import InProcessGuard, InProcessRemedy
from dssup.runtime.agree import Agreement, Code, PeerLost, VerdictTimeout
from dssup.runtime.backstop import GAVE_UP_EXIT, GiveUp, give_up
from dssup.runtime.gradsync import choose_sync
from dssup.runtime.microbatch import finer_split, sample_count, spans, take
from dssup.runtime.oom import is_oom, oom_text
from dssup.runtime.report import report_record, who
from dssup.runtime.tries import Try, caught, free_memory, rng_state, set_rng

__all__ = ["StepGuard", "StepResult"]

log = logging.getLogger(__name__)
_SOURCE = "dssup.runtime.StepGuard"


@dataclass(frozen=True)
class StepResult:
    loss: Any  # detached tensor: the step's loss on this rank (weighted sum of micro-batches)
    tries: int  # 1 when nothing failed
    micro_batch: int
    grad_accum: int


class StepGuard:
    """See the module docstring. Construct it on every rank at the same point (it creates a
    gloo group for the verdicts)."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        global_batch: int,
        micro_batch: int,
        dp: int | None = None,
        loss_reduction: str = "mean",
        scaler: Any = None,
        sync: str = "auto",
        min_micro_batch: int = 1,
        before_optimizer: Callable[[], None] | None = None,
        backward: Callable[[Any], Any] | None = None,
        verdict_timeout_s: float | None = None,
        verdict_floor_s: float = 60.0,
        verdict_every_micro_batch: bool = False,
        on_give_up: str = "exit",
        step: int = 0,
    ) -> None:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.dp = dp or world
        if global_batch % self.dp or micro_batch < 1 or (global_batch // self.dp) % micro_batch:
            raise ConfigError(
                "micro_batch", f"{micro_batch} does not divide the per-rank share of global "
                f"batch {global_batch} over {self.dp} data-parallel ranks",
            )  # fmt: skip
        if loss_reduction not in {"mean", "sum"}:
            raise ConfigError("loss_reduction", f"{loss_reduction!r}", "use 'mean' or 'sum'")
        if on_give_up not in {"exit", "raise"}:
            raise ConfigError("on_give_up", f"{on_give_up!r}", "use 'exit' or 'raise'")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.global_batch, self.share = global_batch, global_batch // self.dp
        self.micro_batch, self.loss_reduction = micro_batch, loss_reduction
        self.min_micro_batch, self.before_optimizer = min_micro_batch, before_optimizer
        self.backward = backward  # e.g. accelerator.backward; default: loss.backward()
        env_timeout = os.environ.get("DSSUP_VERDICT_TIMEOUT_S", "")
        self.verdict_timeout_s = float(env_timeout) if env_timeout else verdict_timeout_s
        self.verdict_floor_s, self.on_give_up, self.steps_done = verdict_floor_s, on_give_up, step
        self.every_micro_batch = verdict_every_micro_batch
        self.sync = choose_sync(model, sync)
        self.agreement = Agreement.create()
        self.longest_step_s = 0.0
        report_record(
            InProcessGuard(
                **who(), source=_SOURCE, sync=self.sync.name, min_micro_batch=min_micro_batch,
                verdict_floor_s=verdict_floor_s, exit_code=GAVE_UP_EXIT,
            )
        )  # fmt: skip

    @property
    def grad_accum(self) -> int:
        return self.share // self.micro_batch

    # --- one optimizer step -------------------------------------------------------------
    def step(self, batch: Any, loss_fn: Callable[[Any], Any]) -> StepResult:
        """Run one optimizer step on this rank's share ``batch`` (see the module docstring)."""
        if (n := sample_count(batch)) != self.share:
            raise ConfigError(
                "batch", f"{n} samples, but this rank's share of global batch "
                f"{self.global_batch} is {self.share}",
            )  # fmt: skip
        started, rng, tries = time.monotonic(), rng_state(), 0
        while True:
            tries += 1
            if tries > 1:
                set_rng(rng)
            loss, failed = self._try(batch, loss_fn, started)
            if failed is None:
                break
            self._redo(failed, started)
        self._optimizer_step()
        self.longest_step_s = max(self.longest_step_s, time.monotonic() - started)
        self.steps_done += 1
        return StepResult(loss, tries, self.micro_batch, self.grad_accum)

    def _try(
        self, batch: Any, loss_fn: Callable[[Any], Any], started: float
    ) -> tuple[Any, Try | None]:
        """Forward and backward of every micro-batch, and the verdict. Returns the loss, and
        None when every rank succeeded, else this rank's outcome with everyone's verdicts."""
        self.model.zero_grad(set_to_none=True)
        self._collective("unshard", self.sync.prepare, started)
        cuts = spans(self.share, self.micro_batch)
        quiet = cuts[:-1] if self.sync.overlapped else cuts
        total: Any = 0.0
        for i, (a, b) in enumerate(quiet):
            with self.sync.quiet():
                outcome, loss = self._micro(take(batch, a, b), (b - a) / self.share, loss_fn)
            if outcome.code == Code.OK:
                total = total + loss
            last = i == len(quiet) - 1
            if outcome.code in (Code.OOM_FORWARD, Code.OOM_BACKWARD) and self._at_floor():
                self._stop(outcome, (), "micro-batch-floor", self._floor_text())
            each = self.every_micro_batch or self.sync.forward_collectives
            if outcome.code != Code.OK or last or each:
                verdicts = self._verdicts(outcome, started)
                if any(verdicts):
                    return total, self._judge(outcome, verdicts)
        if self.sync.overlapped:
            a, b = cuts[-1]
            with self.sync.syncing():
                outcome, loss = self._micro(take(batch, a, b), (b - a) / self.share, loss_fn)
            if outcome.exc is not None:
                raise outcome.exc
            if outcome.code != Code.OK:
                self._stop(outcome, (), "oom-in-synchronised-micro-batch", (
                    "the OOM hit the micro-batch whose backward synchronises gradients; its "
                    "peers may already wait in that collective, so it cannot be redone"
                ))  # fmt: skip
            total = total + loss
        else:
            self._collective(
                "gradient-sync", lambda: self.sync.reduce(self._bound(started)), started
            )
        return total, None

    def _micro(self, micro: Any, weight: float, loss_fn: Callable[[Any], Any]) -> tuple[Try, Any]:
        try:
            loss = loss_fn(micro)
        except Exception as exc:  # classified, re-raised unless an OOM
            return caught(exc, Code.OOM_FORWARD), None
        try:
            scaled = loss * weight if self.loss_reduction == "mean" else loss
            target = self.scaler.scale(scaled) if self.scaler is not None else scaled
            if self.backward is not None:
                self.backward(target)
            else:
                target.backward()
        except Exception as exc:
            return caught(exc, Code.OOM_BACKWARD), None
        return Try(), scaled.detach()

    # --- verdicts -----------------------------------------------------------------------
    def _bound(self, started: float) -> float:
        """How long to wait for the others' verdict: ``DSSUP_VERDICT_TIMEOUT_S`` or
        ``verdict_timeout_s`` when set, else ``verdict_floor_s`` + 4 x the longer of the
        longest step so far and this step until now. Generous on purpose: the step that OOMs
        is often the first of a new, slower shape, and a false timeout costs a restart."""
        if self.verdict_timeout_s is not None:
            return self.verdict_timeout_s
        return self.verdict_floor_s + 4 * max(self.longest_step_s, time.monotonic() - started)

    def _verdicts(self, mine: Try, started: float) -> tuple[Code, ...]:
        bound = self._bound(started)
        try:
            return self.agreement.exchange(mine.code, bound)
        except VerdictTimeout as exc:
            self._stop(mine, (), "verdict-timeout", f"{exc}; a rank is stuck")
        except PeerLost as exc:
            self._stop(mine, (), "peer-lost", str(exc))
        raise AssertionError("unreachable")  # pragma: no cover - _stop never returns

    def _judge(self, mine: Try, verdicts: tuple[Code, ...]) -> Try:
        """Every rank runs this on the same verdicts, so every rank decides the same."""
        if mine.exc is not None:
            raise mine.exc
        if Code.ERROR in verdicts:
            bad = [r for r, c in enumerate(verdicts) if c == Code.ERROR]
            self._stop(mine, verdicts, "peer-error", f"rank(s) {bad} failed with a non-OOM error")
        return Try(mine.code, mine.error, mine.traceback, verdicts=verdicts)

    def _redo(self, mine: Try, started: float) -> None:
        """All ranks agreed that someone OOMed: move to a finer split, or give up together."""
        verdicts = mine.verdicts
        new = finer_split(self.micro_batch, self.share, self.min_micro_batch)
        if new is None:  # unreachable: a rank that OOMs at the floor leaves before the verdict
            self._stop(mine, verdicts, "micro-batch-floor", self._floor_text())
            return
        oom = [
            (r, c.phase)
            for r, c in enumerate(verdicts)
            if c in (Code.OOM_FORWARD, Code.OOM_BACKWARD)
        ]
        old_mb, old_gas = self.micro_batch, self.grad_accum
        self.micro_batch = new
        report_record(
            InProcessRemedy(
                **who(), source=_SOURCE, step=self.steps_done, old_micro_batch=old_mb,
                old_grad_accum=old_gas, micro_batch=new, grad_accum=self.grad_accum, dp=self.dp,
                global_batch=self.global_batch, oom_ranks=tuple(r for r, _ in oom),
                oom_phases=tuple(p for _, p in oom), error=mine.error,
                lost_s=round(time.monotonic() - started, 4),
            )
        )  # fmt: skip
        log.warning(
            "dssup: OOM at step %s (%s); redoing it in-process with micro-batch %s -> %s, "
            "accumulation %s -> %s (global batch %s)",
            self.steps_done, ", ".join(f"rank {r} {p}" for r, p in oom), old_mb, new, old_gas,
            self.grad_accum, self.global_batch,
        )  # fmt: skip
        free_memory()

    # --- what cannot be redone ----------------------------------------------------------
    def _at_floor(self) -> bool:
        return finer_split(self.micro_batch, self.share, self.min_micro_batch) is None

    def _floor_text(self) -> str:
        return (
            f"an OOM at micro-batch {self.micro_batch}, the finest split allowed (share "
            f"{self.share}, min_micro_batch {self.min_micro_batch}); nothing to agree on"
        )

    def _collective(self, what: str, fn: Callable[[], None], started: float) -> None:
        try:
            fn()
        except Exception as exc:  # any failure inside a collective ends it
            if is_oom(exc):
                reason = "oom-in-collective"
            elif "timed out" in str(exc).lower():
                reason = "verdict-timeout"
            else:
                reason = "peer-lost"
            self._stop(caught(exc, Code.ERROR), (), reason, f"{what}: {oom_text(exc)}")

    def _optimizer_step(self) -> None:
        try:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            if self.before_optimizer is not None:
                self.before_optimizer()
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._stop(caught(exc, Code.ERROR), (), "oom-in-optimizer-step", (
                "the optimizer state may be half-updated, so the step cannot be redone"
            ))  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)

    def _stop(self, mine: Try, verdicts: tuple[Code, ...], reason: str, detail: str) -> None:
        oom = tuple(r for r, c in enumerate(verdicts) if c in (Code.OOM_FORWARD, Code.OOM_BACKWARD))
        why = GiveUp(
            reason=reason, detail=detail, step=self.steps_done, micro_batch=self.micro_batch,
            grad_accum=self.grad_accum, dp=self.dp, global_batch=self.global_batch,
            phase=mine.code.phase or reason.removeprefix("oom-in-"), oom_ranks=oom,
            error=mine.error, traceback=mine.traceback,
        )  # fmt: skip
        give_up(why, self.on_give_up)
