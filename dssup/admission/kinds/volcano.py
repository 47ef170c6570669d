"""Volcano ``Job`` (batch.volcano.sh/v1alpha1): one pod set per task, count = replicas.

Replicas are not grown by a resize (``minAvailable`` and the gang plugins would disagree)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.admission.kinds.base import Context, KindReader
from dssup.admission.podspec import as_int, as_list, as_map, pod_set
from dssup.admission.view import PodSetView

__all__ = ["READER"]


def _read(obj: Mapping[str, Any], ctx: Context) -> list[PodSetView]:
    out = []
    for i, raw in enumerate(as_list(as_map(obj.get("spec")).get("tasks"))):
        task = as_map(raw)
        template = as_map(task.get("template"))
        out.append(
            pod_set(
                str(task.get("name", i)),
                as_int(task.get("replicas"), 1),
                as_map(template.get("spec")),
                f"/spec/tasks/{i}/template/spec",
                ctx.cache,
                ctx.notes,
                template_meta=as_map(template.get("metadata")),
            )
        )
    if not out:
        ctx.notes.append("spec.tasks is empty")
    return out


READER = KindReader("batch.volcano.sh", ("v1alpha1",), "Job", _read, ())
