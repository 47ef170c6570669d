"""A traced profile on one device (pipeline rank): what ``estimate`` and ``plan`` both call, so
they agree to the byte.

A device holds one stage (1F1B) or several (DualPipe, interleaved); the replay
(``traced_stage``) walks one stage's blocks. Several held stages are replayed as one stage
holding all their blocks, each in-flight micro-batch keeping the stored bytes of all of them,
with the largest in-flight count of any held stage: an upper bound, said in the assumptions.
"""

from __future__ import annotations

from dssup.memory.config import Layout, Recompute, Training
from dssup.memory.core import PreparedDevice, device_in_flight
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import TracedStage, traced_stage

__all__ = ["traced_device", "traced_in_flight"]


def traced_device(
    p: TracedProfile, dev: PreparedDevice, layout: Layout, t: Training, device_grads: int
) -> TracedStage:
    """The replay of every block the device holds (``device_grads``: its gradient bytes)."""
    dense = sum(st.params.dense_layers for st in dev.stages)
    moe = sum(st.params.moe_layers for st in dev.stages)
    first = any(st.params.first for st in dev.stages)
    last = any(st.params.last for st in dev.stages)
    return traced_stage(p, layout, t, dense, moe, first, last, device_grads)


def traced_in_flight(dev: PreparedDevice, layout: Layout, rc: Recompute, m: int) -> int:
    """Micro-batches whose stored bytes are alive at the device's peak (the largest count of
    any stage it holds)."""
    return max(device_in_flight(dev, layout, rc, m)[1])
