"""Host memory as a verdict: a job whose offloaded states do not fit where its pods run.

A config that fits the GPU can still die: the kernel's OOM killer ends the container when the
optimizer states DeepSpeed offloads (FP32 master, moments, gradient buffers, pinned staging)
pass the container's memory limit, or the node's memory. The estimate already holds the host
bytes per GPU, term by term (``dssup.memory.offload``); this module compares them with what the
pod gets:

- the GPU containers' ``resources.limits.memory`` (the training processes' cgroup) when every
  one states it: the need is per pod, ``GPUs per pod x host bytes per GPU``;
- else the memory of the GPU's reference node (``dssup gpus``; DGX H100: 2 TiB), assumed and
  said so: the need is per node, ``GPUs per node x host bytes per GPU``;
- else nothing to compare with: allowed, with a warning that names what was not checked.

A config that needs no host memory (no offload, model built on the GPU) is not checked at all.
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.admission.view import JobView
from dssup.memory import Estimate, GiB
from dssup.memory.gpus import gpu_for_product
from dssup.memory.offload import HOST_TERMS

__all__ = ["HostVerdict", "host_verdict"]


class HostVerdict(NamedTuple):
    """The host check of one judged job. ``limit`` None: nothing to compare with."""

    need: int  # bytes per pod (with a pod limit) or per node
    limit: int | None
    where: str  # "per pod" | "per node"
    source: str  # where ``limit`` came from
    terms: str  # the terms that make up ``need``, largest first

    @property
    def fits(self) -> bool | None:
        return None if self.limit is None else self.need <= self.limit

    def words(self) -> str:
        """One sentence: the need by term against the limit and its source."""
        need = f"{self.need / GiB:.1f} GiB {self.where} ({self.terms})"
        if self.limit is None:
            return f"host memory not checked ({self.source}); needed {need}"
        verdict = "fits" if self.fits else "exceeds"
        return f"host memory needed {need} {verdict} {self.limit / GiB:.1f} GiB ({self.source})"


def _terms(est: Estimate, count: int) -> tuple[int, str]:
    """Bytes for ``count`` GPUs of the stage with the largest host need, and its terms."""
    stage = max(est.stages, key=lambda s: max(s.host_bytes, s.host_init_bytes))
    if stage.host_init_bytes > stage.host_bytes:
        return count * stage.host_init_bytes, "model built on the host before partitioning"
    parts = sorted(stage.host_terms.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{HOST_TERMS.get(k, k)} {count * v / GiB:.1f}" for k, v in parts)
    return count * stage.host_bytes, text or "offloaded states"


def host_verdict(est: Estimate, view: JobView, product: str) -> HostVerdict | None:
    """The host check of ``est`` for the pods of ``view`` on GPU ``product``; None when the
    config needs no host memory."""
    if not any(max(s.host_bytes, s.host_init_bytes) for s in est.stages):
        return None
    sets = view.training_sets
    limits = [ps.memory_limit_bytes for ps in sets]
    if sets and all(limit is not None for limit in limits):
        per_pod = max(ps.gpus_per_pod for ps in sets)
        need, terms = _terms(est, per_pod)
        smallest = min(limit for limit in limits if limit is not None)
        return HostVerdict(need, smallest, "per pod", "the GPU container's memory limit", terms)
    spec = gpu_for_product(product)
    if spec is None or not spec.system.host_memory_bytes:
        need, terms = _terms(est, max((ps.gpus_per_pod for ps in sets), default=1))
        why = "set resources.limits.memory: the GPU container has none and the node's is unknown"
        return HostVerdict(need, None, "per pod", why, terms)
    need, terms = _terms(est, spec.system.gpus_per_node)
    source = (
        f"{spec.system.name}, the {spec.name} reference node, assumed: the GPU container "
        "states no memory limit"
    )
    return HostVerdict(need, spec.system.host_memory_bytes, "per node", source, terms)
