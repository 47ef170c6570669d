"""Kubeflow ``MPIJob`` (kubeflow.org/v2beta1): workers hold the GPUs, the launcher the command.

The launcher's ``mpirun ... python train.py --flags`` line is read (and rewritten) as the
job's launch line; its pod has no GPUs and does not count in the world size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_map, pod_set
from dssup.admission.view import PodSetView, escape

__all__ = ["READER"]


def _read(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    specs = as_map(as_map(obj.get("spec")).get("mpiReplicaSpecs"))
    if not specs:
        ctx.notes.append("spec.mpiReplicaSpecs is missing")
    out = []
    for rtype, raw in specs.items():
        rspec = as_map(raw)
        base = f"/spec/mpiReplicaSpecs/{escape(str(rtype))}"
        template = as_map(rspec.get("template"))
        ps = pod_set(
            str(rtype),
            as_int(rspec.get("replicas"), 1),
            as_map(template.get("spec")),
            f"{base}/template/spec",
            ctx.cache,
            ctx.notes,
            template_meta=as_map(template.get("metadata")),
        )
        if rtype == "Launcher":
            ps = ps._replace(containers=tuple(c._replace(launcher=True) for c in ps.containers))
        out.append(ps)
    return out


READER = KindReader("kubeflow.org", ("v2beta1",), "MPIJob", _read, ("spec", "runPolicy", "suspend"))
