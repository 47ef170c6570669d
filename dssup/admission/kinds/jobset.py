"""``JobSet`` (jobset.x-k8s.io/v1alpha2): one pod set per replicated job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_list, as_map, pod_set
from dssup.admission.view import PodSetView

__all__ = ["READER"]


def _read(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    out = []
    for i, raw in enumerate(as_list(as_map(obj.get("spec")).get("replicatedJobs"))):
        rj = as_map(raw)
        jspec = as_map(as_map(rj.get("template")).get("spec"))
        step = as_int(jspec.get("parallelism"), 1)
        count = as_int(rj.get("replicas"), 1) * step
        template = as_map(jspec.get("template"))
        path = f"/spec/replicatedJobs/{i}/template/spec/template/spec"
        scale = ((f"/spec/replicatedJobs/{i}/replicas",), max(1, step), None)
        out.append(
            pod_set(
                str(rj.get("name", i)),
                count,
                as_map(template.get("spec")),
                path,
                ctx.cache,
                ctx.notes,
                scale,
                as_map(template.get("metadata")),
            )
        )
    if not out:
        ctx.notes.append("spec.replicatedJobs is empty")
    return out


READER = KindReader("jobset.x-k8s.io", ("v1alpha2",), "JobSet", _read)
