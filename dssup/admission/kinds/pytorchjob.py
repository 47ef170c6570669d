"""Kubeflow ``PyTorchJob`` (kubeflow.org/v1): one pod set per replica type (Master, Worker)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_map, pod_set
from dssup.admission.view import PodSetView, escape

__all__ = ["READER"]


def _read(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    spec = as_map(obj.get("spec"))
    specs = as_map(spec.get("pytorchReplicaSpecs"))
    if not specs:
        ctx.notes.append("spec.pytorchReplicaSpecs is missing")
    elastic = as_int(as_map(spec.get("elasticPolicy")).get("maxReplicas"), 0)
    out = []
    for rtype, raw in specs.items():
        rspec = as_map(raw)
        base = f"/spec/pytorchReplicaSpecs/{escape(str(rtype))}"
        template = as_map(rspec.get("template"))
        pod = as_map(template.get("spec"))
        scale = ((f"{base}/replicas",), 1, elastic or None) if rtype == "Worker" else ((), 1, None)
        replicas = rspec.get("replicas")
        count = as_int(replicas, 1)
        if replicas is not None and as_int(replicas, -1) < 0:
            ctx.notes.append(f"unreadable: {rtype}.replicas {replicas!r}")
        out.append(
            pod_set(
                str(rtype),
                count,
                pod,
                f"{base}/template/spec",
                ctx.cache,
                ctx.notes,
                scale,
                as_map(template.get("metadata")),
            )
        )
    return out


READER = KindReader("kubeflow.org", ("v1",), "PyTorchJob", _read, ("spec", "runPolicy", "suspend"))
