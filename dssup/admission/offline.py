"""``dssup admit``: the webhook's policy on a YAML file, no cluster needed.

Does what kube-apiserver would do with the webhooks of the job's namespace. In an enforcing
namespace: ``mutate`` (CREATE), apply its patch, then ``validate`` the result; in a warning
namespace: the ``/warn`` answer only (allowed, with warnings); ``off``: nothing is judged. The
namespace's mode comes from ``--namespace-mode``, else from a Namespace document in the input
(its ``dssup.io/enforce`` / ``dssup.io/admission`` labels), else enforce, and is stated in the
output. Cluster objects (Nodes with GFD labels, ConfigMaps, (Cluster)TrainingRuntimes) found in
the input or in ``--cluster`` files fill the cache the webhook would have watched, with the
server's rule: ConfigMaps that do not match ``--configmap-selector`` are not used (the webhook
would not see them) and the output says so. Without Nodes the built-in GPU tables answer.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonpatch
import yaml

from dssup.admission.cache import RUNTIME_KINDS, InMemoryCache
from dssup.admission.decision import Decision
from dssup.admission.kinds import identify
from dssup.admission.policy import Policy
from dssup.admission.settings import PolicySettings
from dssup.errors import ConfigError

__all__ = ["AdmitResult", "NamespaceMode", "admit", "load_documents", "selector_matches"]

NamespaceMode = Literal["enforce", "warn", "off"]
_CLUSTER_KINDS = {"Node", "ConfigMap", *RUNTIME_KINDS}
JOB_KINDS = frozenset({"PyTorchJob", "TrainJob", "JobSet", "Job", "Pod", "MPIJob"})
ENFORCE_LABEL, ADMISSION_LABEL = "dssup.io/enforce", "dssup.io/admission"


@dataclass(frozen=True)
class AdmitResult:
    """The final answer for one job, the patched object and a YAML diff of the patch."""

    name: str
    decision: Decision
    original: Mapping[str, Any]
    patched: Mapping[str, Any]
    namespace_mode: str = "enforce (default)"
    notes: tuple[str, ...] = field(default=())

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
            "namespaceMode": self.namespace_mode,
            "notes": list(self.notes),
        }


def load_documents(texts: Iterable[str]) -> list[dict[str, Any]]:
    """Every YAML document (``List`` kinds flattened); ``ConfigError`` if one is not an object."""
    docs: list[dict[str, Any]] = []
    for text in texts:
        try:
            loaded = list(yaml.safe_load_all(text))
        except (yaml.YAMLError, RecursionError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError("-f", f"not YAML: {first}", "pass Kubernetes YAML") from None
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise ConfigError(
                    "-f", "a document is not a Kubernetes object", "give apiVersion and kind"
                )
            kind = doc["kind"]
            if not isinstance(kind, str):
                raise ConfigError("-f", f"a document's kind is {kind!r}, not a name", "fix kind")
            items = doc.get("items") if kind.endswith("List") else [doc]
            docs.extend(
                i for i in (items if isinstance(items, list) else []) if isinstance(i, dict)
            )
    return docs


def selector_matches(selector: str, labels: Mapping[str, Any]) -> bool:
    """An equality-based label selector (``a=b,c!=d,e``), as the server's ConfigMap watch."""
    for part in (p.strip() for p in selector.split(",") if p.strip()):
        if "!=" in part:
            key, _, value = part.partition("!=")
            if str(labels.get(key.strip())) == value.strip():
                return False
        elif "=" in part:
            key, _, value = part.replace("==", "=").partition("=")
            if str(labels.get(key.strip())) != value.strip():
                return False
        elif part.startswith("!"):
            if part[1:] in labels:
                return False
        elif part not in labels:
            return False
    return True


def _meta(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = doc.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _mode_of(namespace: Mapping[str, Any] | None) -> tuple[NamespaceMode, str]:
    if namespace is None:
        return "enforce", "enforce (default: no Namespace given)"
    labels = _meta(namespace).get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    name = _meta(namespace).get("name")
    if labels.get(ADMISSION_LABEL) == "off":
        return "off", f"off (Namespace {name} is labelled {ADMISSION_LABEL}=off)"
    if labels.get(ENFORCE_LABEL) == "true":
        return "enforce", f"enforce (Namespace {name} is labelled {ENFORCE_LABEL}=true)"
    return "warn", f"warn (Namespace {name} is not labelled {ENFORCE_LABEL}=true)"


def _judge(
    policy: Policy, obj: dict[str, Any], ns: str, mode: NamespaceMode, mutate: bool
) -> tuple[Decision, Mapping[str, Any]]:
    if mode == "off":
        return Decision(allowed=True, code="not-applicable", message="namespace mode off"), obj
    if mode == "warn":
        return policy.judge(obj, ns, "warn"), obj
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
    return final, patched


def admit(
    documents: list[dict[str, Any]],
    *,
    namespace: str = "default",
    mutate: bool = True,
    settings: PolicySettings | None = None,
    namespace_mode: NamespaceMode | None = None,
    configmap_selector: str = "dssup.io/watch=true",
) -> list[AdmitResult]:
    """Judge every job in ``documents``; the other documents describe the cluster."""
    cache = InMemoryCache()
    jobs, notes, namespaces = [], [], {}
    for doc in documents:
        kind = doc.get("kind")
        if kind == "Namespace":
            namespaces[str(_meta(doc).get("name"))] = doc
        elif kind == "ConfigMap" and not selector_matches(
            configmap_selector, _meta(doc).get("labels") or {}
        ):
            notes.append(
                f"ConfigMap {_meta(doc).get('namespace') or namespace}/{_meta(doc).get('name')} "
                f"does not match {configmap_selector!r}: the webhook would not see it; not used"
            )
        elif kind in _CLUSTER_KINDS:
            named = kind != "ConfigMap" or _meta(doc).get("namespace")
            cache.upsert(
                doc if named else {**doc, "metadata": {**_meta(doc), "namespace": namespace}}
            )
        elif identify(doc)[0] is not None or kind in JOB_KINDS:
            jobs.append(doc)  # a job kind at a version dssup does not read is answered too
    if not jobs:
        raise ConfigError(
            "-f",
            "no PyTorchJob, TrainJob, JobSet, Job, MPIJob or Pod found",
            "pass a job manifest",
        )
    policy = Policy(cache, settings, explain=True)
    results = []
    for job in jobs:
        ns = str(_meta(job).get("namespace") or namespace)
        if namespace_mode is not None:
            mode, said = namespace_mode, f"{namespace_mode} (--namespace-mode)"
        else:
            mode, said = _mode_of(namespaces.get(ns))
        decision, patched = _judge(policy, job, ns, mode, mutate)
        name = f"{job.get('kind')}/{_meta(job).get('name', '?')}"
        results.append(AdmitResult(name, decision, job, patched, said, tuple(notes)))
    return results
