"""``DssupCallback``: a Hugging Face ``Trainer`` callback that writes the job-side report.

Add it to any ``Trainer`` (or TRL trainer) with ``trainer.add_callback(DssupCallback())`` or
``Trainer(..., callbacks=[DssupCallback()])``. Under ``dssup run`` every rank then records, at
``on_train_begin`` (after a resume has restored the trainer state), the per-device batch, the
accumulation, the world size, the global batch the Trainer computes from them, and the step it
resumes from; rank 0 records each checkpoint after it is written (``on_save``); every rank
records the end of its training loop at ``on_train_end`` (``final=False``: the script's own
final save comes after it), so a finished run is never trained again, and an abort after it
is a teardown only once dssup sees the final save whole.
Without dssup it does nothing.

The global batch is ``args.train_batch_size x gradient_accumulation_steps x world_size``, which
is the Trainer's own "Total train batch size" for data-parallel jobs; jobs with tensor, context
or sequence parallelism inside the Trainer (``parallelism_config``) divide the world further,
which this callback does not see: they report the world size as the data-parallel size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from dssup.runtime.report import report_checkpoint, report_completed, report_started

__all__ = ["DssupCallback"]

_SOURCE = "dssup.runtime.hf.DssupCallback"


class DssupCallback(TrainerCallback):
    """Reports what the Trainer really trains with (see the module docstring)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_device = int(args.train_batch_size)
        accumulation = int(args.gradient_accumulation_steps)
        world = int(args.world_size)
        report_started(
            micro_batch=per_device,
            grad_accum=accumulation,
            dp=world,
            world_size=world,
            global_batch=per_device * accumulation * world,
            first_step=int(state.global_step),
            resumed_from=args.resume_from_checkpoint if state.global_step else None,
            recompute="full" if args.gradient_checkpointing else "none",
            framework="hf-trainer",
            source=_SOURCE,
        )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            report_checkpoint(int(state.global_step), path, source=_SOURCE)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the script's own save_model/save_state come after this: not the end of its work
        report_completed(int(state.global_step), source=_SOURCE, final=False)
