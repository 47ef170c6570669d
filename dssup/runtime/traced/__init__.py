"""Measure and calibrate the user's own model code: a ``transformers`` model or any ``nn.Module``.

Why it exists: a profile traced from dssup's reference blocks describes dssup's blocks, not the
user's. Real code stores other things (transformers' MLA under SDPA keeps the s x s
probabilities in fp32, its grouped-mm experts keep sorted copies and int64 indices, its router an
fp32 copy of the layer input). This package runs the user's model itself:

* ``measure`` (``dssup measure --hf`` / ``--module``): real, allocating training steps on CPU
  under PyTorch's ``MemTracker``, cross-checked against ``torch.profiler`` memory events;
* ``calibrate`` (``dssup calibrate --hf`` / ``--module``): the same steps under
  ``FakeTensorMode`` (full shapes, nothing allocated) for reduced models made of the user's own
  blocks, fitted into an ``EagerProfile`` the (pure) memory model composes.

Imported only by the child process the CLI starts (``python -m dssup.runtime.traced``), by
bench scripts and tests: it needs torch, and transformers for ``--hf``.
"""

from dssup.runtime.traced.knobs import HFSource, Knobs, ModuleSource, TracedRun

__all__ = ["HFSource", "Knobs", "ModuleSource", "TracedRun"]
