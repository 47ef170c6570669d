"""An OOM inside DeepSpeed's ``engine.step`` (ZeRO's gradient flattening and fp32 cast run there,
outside ``torch/optim``) is an optimizer-phase failure: the remedy ladder depends on it."""

from __future__ import annotations

from dssup.supervisor.classify import phase_of

DS_STEP = """Traceback (most recent call last):
  File "/x/examples/deepspeed/train_ds.py", line 183, in train_step
    engine.step()
  File "/x/deepspeed/runtime/engine.py", line 3615, in step
    self._take_model_step(lr_kwargs)
  File "/x/deepspeed/runtime/engine.py", line 3520, in _take_model_step
    self.optimizer.step()
  File "/x/deepspeed/runtime/zero/stage_1_and_2.py", line 3110, in step
    single_grad_partition = flat_grad_partition.to(self.single_partition_of_fp32_groups[i].dtype)
RuntimeError: DefaultCPUAllocator: can't allocate memory
"""


def test_deepspeed_engine_step_is_optimizer_phase() -> None:
    assert phase_of(DS_STEP) == "optimizer"


def test_forward_is_still_forward() -> None:
    assert phase_of(DS_STEP.replace("_take_model_step", "forward_step")) == "forward"
