"""``dssup admit``: the webhook's policy on a YAML file, no cluster needed.

Does what kube-apiserver would do with both webhooks: run ``mutate`` (CREATE), apply its patch,
then ``validate`` the result. Cluster objects (Nodes with GFD labels, ConfigMaps,
(Cluster)TrainingRuntimes) found in the input or in ``--cluster`` files fill the cache the
webhook would have watched; without Nodes the built-in GPU table answers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch
import yaml

from dssup.admission.cache import RUNTIME_KINDS, InMemoryCache
from dssup.admission.decision import Decision
from dssup.admission.kinds import SUPPORTED
from dssup.admission.policy import Policy
from dssup.admission.settings import PolicySettings
from dssup.errors import ConfigError

__all__ = ["AdmitResult", "admit", "load_documents"]

_CLUSTER_KINDS = {"Node", "ConfigMap", *RUNTIME_KINDS}


@dataclass(frozen=True)
class AdmitResult:
    """The final answer for one job, the patched object and a YAML diff of the patch."""

    name: str
    decision: Decision
    original: Mapping[str, Any]
    patched: Mapping[str, Any]

    def diff(self) -> str:
        if not self.decision.patch:
            return ""
        a = yaml.safe_dump(dict(self.original), sort_keys=False).splitlines(keepends=True)
        b = yaml.safe_dump(dict(self.patched), sort_keys=False).splitlines(keepends=True)
        return "".join(
            difflib.unified_diff(a, b, f"{self.name} (submitted)", f"{self.name} (admitted)")
        )

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "allowed": d.allowed,
            "code": d.code,
            "message": d.message,
            "warnings": list(d.warnings),
            "patch": list(d.patch),
        }


def load_documents(texts: Iterable[str]) -> list[dict[str, Any]]:
    """Every YAML document (``List`` kinds flattened); ``ConfigError`` if one is not an object."""
    docs: list[dict[str, Any]] = []
    for text in texts:
        try:
            loaded = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise ConfigError(
                "-f", f"not YAML: {exc}".splitlines()[0], "pass Kubernetes YAML"
            ) from None
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise ConfigError(
                    "-f", "a document is not a Kubernetes object", "give apiVersion and kind"
                )
            docs.extend(doc.get("items") or [] if doc["kind"].endswith("List") else [doc])
    return docs


def _judge(policy: Policy, obj: dict[str, Any], namespace: str, mutate: bool) -> AdmitResult:
    ns = str((obj.get("metadata") or {}).get("namespace") or namespace)
    name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"
    patched, first = obj, None
    if mutate:
        first = policy.judge(obj, ns, "mutate")
        if first.patch:
            patched = jsonpatch.apply_patch(obj, list(first.patch))
    final = policy.judge(patched, ns, "validate")
    if first is not None and first.code == "resized" and final.allowed:
        final = first.model_copy(update={"warnings": (*first.warnings, *final.warnings)})
    elif first is not None and first.patch:
        final = final.model_copy(update={"patch": first.patch})
    return AdmitResult(name, final, obj, patched)


def admit(
    documents: list[dict[str, Any]],
    *,
    namespace: str = "default",
    mutate: bool = True,
    settings: PolicySettings | None = None,
) -> list[AdmitResult]:
    """Judge every job in ``documents``; the other documents describe the cluster."""
    cache = InMemoryCache()
    jobs = []
    for doc in documents:
        if doc.get("kind") in _CLUSTER_KINDS:
            cache.upsert(doc)
        elif doc.get("kind") in SUPPORTED:
            jobs.append(doc)
    if not jobs:
        raise ConfigError(
            "-f", "no PyTorchJob, TrainJob, JobSet, Job or Pod found", "pass a job manifest"
        )
    policy = Policy(cache, settings, explain=True)
    return [_judge(policy, job, namespace, mutate) for job in jobs]
