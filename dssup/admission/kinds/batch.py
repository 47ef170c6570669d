"""``batch/v1`` Job (one pod set, count = parallelism) and core ``v1`` Pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_map, pod_set
from dssup.admission.view import PodSetView

__all__ = ["JOB", "POD"]


def _job(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    spec = as_map(obj.get("spec"))
    template = as_map(spec.get("template"))
    parallelism = as_int(spec.get("parallelism"), 1)
    paths: tuple[str, ...] = ("/spec/parallelism",)
    if as_int(spec.get("completions"), -1) == parallelism:
        paths += ("/spec/completions",)
    return [
        pod_set(
            "job",
            parallelism,
            as_map(template.get("spec")),
            "/spec/template/spec",
            ctx.cache,
            ctx.notes,
            (paths, 1, None),
            as_map(template.get("metadata")),
        )
    ]


def _pod(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    # A Pod's own metadata is its template's: its annotations reach the containers.
    return [
        pod_set(
            "pod",
            1,
            as_map(obj.get("spec")),
            "/spec",
            ctx.cache,
            ctx.notes,
            template_meta=as_map(obj.get("metadata")),
        )
    ]


JOB = KindReader("batch", ("v1",), "Job", _job)
POD = KindReader("", ("v1",), "Pod", _pod, ())
