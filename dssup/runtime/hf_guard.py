"""In-process OOM recovery for Hugging Face ``Trainer`` scripts: ``guarded(Trainer)``.

``Trainer`` has no hook between a micro-batch's OOM and the next optimizer step, but
``training_step`` is its documented override point (one call per micro-batch, with the
accumulation window's ``num_items_in_batch``). ``guarded(Trainer)`` (or ``guarded(SFTTrainer)``)
returns a subclass whose ``training_step`` does what ``dssup.runtime.StepGuard`` does:

* it keeps the inputs of the current accumulation window (references to the batch tensors the
  dataloader already made; nothing is copied) and the RNG state at the window's start;
* it runs each micro-batch as ``k`` equal pieces (``k`` = 1 until the first OOM), every piece
  without DDP communication (``no_sync``), through ``Trainer.training_step`` itself, so the
  loss, its scaling for accumulation (``num_items_in_batch``, or the mean divided by the
  accumulation, here by the accumulation times ``k``) and ``accelerator.backward`` stay the
  Trainer's own;
* after every micro-batch all ranks exchange their verdict (``dssup.runtime.agree``); after an
  OOM anywhere every rank zeroes the gradients, rewinds the RNG, splits pieces finer and redoes
  the window so far from the kept inputs; at the window's last micro-batch the gradients are
  averaged over the ranks (as DDP would have) before the Trainer clips and steps;
* what cannot be redone (the finest split, a lost peer) ends the worker like ``StepGuard``:
  an ``inprocess-gave-up`` record and exit status 75 for ``dssup run`` to take over.

The global batch is unchanged: per-device batch x accumulation x world stays the Trainer's;
the report says micro-batch ``per_device / k`` x accumulation ``gradient_accumulation_steps x k``,
which is what ``dssup run`` hands the next attempt (``--per_device_train_batch_size``,
``--gradient_accumulation_steps``) if it must restart.

Not covered, with the reason: models the Trainer shards (FSDP, DeepSpeed ZeRO): their hooks
communicate inside every micro-batch (see ``dssup.runtime.gradsync``); ``guarded`` refuses
them at the first step. accelerate's own ``find_executable_batch_size`` retries a whole
function with a smaller batch on each process alone: it changes the global batch and does not
coordinate ranks, so it is not used; an accelerate training loop uses ``StepGuard`` directly
(pass ``backward=accelerator.backward``).
"""

from __future__ import annotations

import time
from typing import Any

from dssup.errors import ConfigError
from dssup.jobreport import InProcessGuard, InProcessRemedy
from dssup.runtime.agree import Agreement, Code, PeerLost, VerdictTimeout
from dssup.runtime.backstop import GAVE_UP_EXIT, GiveUp, give_up
from dssup.runtime.gradsync import DeferredSync, GradSync
from dssup.runtime.microbatch import sample_count, spans, take
from dssup.runtime.report import report_record, who
from dssup.runtime.tries import Try, caught, free_memory, phase_code, rng_state, set_rng

__all__ = ["guarded"]

_SOURCE = "dssup.runtime.hf_guard"


def _piece_size(n: int, wanted: int) -> int:
    """The largest divisor of ``n`` at most ``wanted`` (equal pieces)."""
    return next(d for d in range(min(n, wanted), 0, -1) if n % d == 0)


class _GuardedStep:
    """State of the guard inside one Trainer (see the module docstring)."""

    def __init__(self, trainer: Any, model: Any) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed and not isinstance(model, DistributedDataParallel):
            raise ConfigError(
                "Trainer", f"the guarded Trainer runs a {type(model).__name__}, not DDP: FSDP and "
                "DeepSpeed communicate inside every micro-batch, which cannot be redone",
                "use the plain Trainer under `dssup run` (the restart path recovers it)",
            )  # fmt: skip
        self.sync: GradSync = (
            DeferredSync(model, model.process_group) if distributed else GradSync()
        )
        self.agreement = Agreement.create()
        self.pieces = 1  # pieces per micro-batch
        self.window: list[tuple[Any, Any]] = []  # (inputs, num_items_in_batch) of this window
        self.window_step = -1
        self.rng: tuple[Any, Any] | None = None
        self.per_device = int(trainer.args.per_device_train_batch_size)
        self.gas = int(trainer.args.gradient_accumulation_steps)
        self.dp = int(trainer.args.world_size)
        self.started = time.monotonic()
        report_record(
            InProcessGuard(
                **who(), source=_SOURCE, sync=self.sync.name, min_micro_batch=1,
                verdict_floor_s=60.0, exit_code=GAVE_UP_EXIT,
            )
        )  # fmt: skip

    def split(self) -> tuple[int, int]:
        mb = max(1, self.per_device // self.pieces)
        return mb, self.gas * (self.per_device // mb)

    def bound(self) -> float:
        return 60.0 + 4 * (time.monotonic() - self.started)


class GuardedTrainingStep:
    """Mixin: put it before ``Trainer`` in the bases (``guarded`` does it for you)."""

    _dssup: _GuardedStep | None = None

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        trainer: Any = self
        if self._dssup is None:
            self._dssup = _GuardedStep(trainer, model)
        g = self._dssup
        step = int(trainer.state.global_step)
        if step != g.window_step:  # the first micro-batch of a new accumulation window
            g.window, g.window_step, g.rng, g.started = [], step, rng_state(), time.monotonic()
        g.window.append((inputs, num_items_in_batch))
        loss, failed = self._dssup_micro(model, inputs, num_items_in_batch)
        while True:  # every rank exchanges exactly once per try
            verdicts = self._dssup_verdicts(failed)
            if not any(verdicts):
                break
            if failed.exc is not None:
                raise failed.exc
            self._dssup_finer(verdicts, failed, step)
            loss, failed = self._dssup_redo(model)
        if trainer.accelerator.sync_gradients:
            try:
                g.sync.reduce(g.bound())
            except Exception as exc:  # any failure inside the gradient all-reduce ends it
                self._dssup_stop(caught(exc, Code.ERROR), (), "peer-lost", f"gradient-sync: {exc}")
        return loss

    # --- helpers ------------------------------------------------------------------------
    def _dssup_micro(self, model: Any, inputs: Any, num_items: Any) -> tuple[Any, Any]:
        trainer: Any = self
        g = self._dssup
        assert g is not None
        n = sample_count(inputs)
        size = _piece_size(n, max(1, g.per_device // g.pieces))
        total: Any = 0.0
        saved = trainer.current_gradient_accumulation_steps
        trainer.current_gradient_accumulation_steps = saved * (n // size)
        try:
            for a, b in spans(n, size):
                with g.sync.quiet():
                    try:
                        total = total + super().training_step(model, take(inputs, a, b), num_items)  # type: ignore[misc]
                    except Exception as exc:  # classified: an OOM is redone, the rest re-raised
                        failed = caught(exc, phase_code(exc))
                        return total, failed
        finally:
            trainer.current_gradient_accumulation_steps = saved
        return total, Try()

    def _dssup_verdicts(self, failed: Any) -> tuple[Code, ...]:
        g = self._dssup
        assert g is not None
        if failed.code in (Code.OOM_FORWARD, Code.OOM_BACKWARD) and g.per_device // g.pieces <= 1:
            self._dssup_stop(failed, (), "micro-batch-floor", "an OOM at micro-batch 1")
        try:
            return g.agreement.exchange(failed.code, g.bound())
        except VerdictTimeout as exc:
            self._dssup_stop(failed, (), "verdict-timeout", str(exc))
        except PeerLost as exc:
            self._dssup_stop(failed, (), "peer-lost", str(exc))
        raise AssertionError("unreachable")  # pragma: no cover

    def _dssup_finer(self, verdicts: tuple[Code, ...], failed: Any, step: int) -> None:
        g = self._dssup
        assert g is not None
        if Code.ERROR in verdicts:
            bad = [r for r, c in enumerate(verdicts) if c == Code.ERROR]
            self._dssup_stop(failed, verdicts, "peer-error", f"rank(s) {bad} failed")
        old_mb, old_gas = g.split()
        g.pieces = g.per_device // max(1, _piece_size(g.per_device, old_mb // 2))
        mb, gas = g.split()
        oom = [
            (r, c.phase)
            for r, c in enumerate(verdicts)
            if c in (Code.OOM_FORWARD, Code.OOM_BACKWARD)
        ]
        report_record(
            InProcessRemedy(
                **who(), source=_SOURCE, step=step, old_micro_batch=old_mb, old_grad_accum=old_gas,
                micro_batch=mb, grad_accum=gas, dp=g.dp, global_batch=mb * gas * g.dp,
                oom_ranks=tuple(r for r, _ in oom), oom_phases=tuple(p for _, p in oom),
                error=failed.error, lost_s=round(time.monotonic() - g.started, 4),
            )
        )  # fmt: skip

    def _dssup_redo(self, model: Any) -> tuple[Any, Any]:
        """Zero the gradients, rewind the RNG, redo the window so far at the finer split;
        the loss of the current micro-batch, and how the try went (stops at a failure)."""
        trainer: Any = self
        g = self._dssup
        assert g is not None and g.rng is not None
        free_memory()
        trainer.model.zero_grad(set_to_none=True)
        set_rng(g.rng)
        loss: Any = 0.0
        for inputs, num_items in g.window:
            loss, failed = self._dssup_micro(model, inputs, num_items)
            if failed.code != Code.OK:
                return loss, failed
        return loss, Try()

    def _dssup_stop(
        self, failed: Any, verdicts: tuple[Code, ...], reason: str, detail: str
    ) -> None:
        g = self._dssup
        assert g is not None
        mb, gas = g.split()
        oom = tuple(r for r, c in enumerate(verdicts) if c in (Code.OOM_FORWARD, Code.OOM_BACKWARD))
        give_up(
            GiveUp(
                reason=reason, detail=detail, step=int(self.state.global_step),  # type: ignore[attr-defined]
                micro_batch=mb, grad_accum=gas, dp=g.dp, global_batch=mb * gas * g.dp,
                phase=failed.code.phase, oom_ranks=oom, error=failed.error,
                traceback=failed.traceback,
            ),
            "exit",
        )  # fmt: skip


def guarded(trainer_cls: type[Any]) -> type[Any]:
    """``trainer_cls`` with in-process OOM recovery (see the module docstring)."""
    return type(f"Guarded{trainer_cls.__name__}", (GuardedTrainingStep, trainer_cls), {})
