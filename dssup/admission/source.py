"""Find a job's training config: annotations first, then Megatron/HF flags, env, DeepSpeed JSON.

The result names, for every knob, the value and the *kind* of place it came from, so the patch
writer can rewrite the same places and the messages can tell the user what to change. Anything
missing or contradictory is reported as a problem (the policy then allows with a warning)
rather than guessed, except documented defaults (e.g. Megatron's global batch = mbs x dp).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dssup.admission.argv import Hit, find
from dssup.admission.cache import ClusterCache
from dssup.admission.flags import DS_CONFIG, ENV, HF, MEGATRON, SWITCHES, all_names
from dssup.admission.view import ContainerView, EnvVar, JobView, PodSetView
from dssup.errors import ConfigError

__all__ = ["Found", "Sources", "positive", "read_sources", "switch"]

_ALL = all_names()
_NO_NAMES: frozenset[str] = frozenset()


@dataclass(slots=True)
class Found:
    """A value and the kind of place it came from (annotation, megatron, hf, env, deepspeed)."""

    value: str
    origin: str
    where: str


@dataclass(slots=True)
class Sources:
    """Every raw value the job states, by knob, in priority order."""

    view: JobView
    containers: list[tuple[PodSetView, ContainerView]]
    flags: dict[str, list[Hit]] = field(default_factory=dict)
    deepspeed: Mapping[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _envs: dict[str, EnvVar] | None = None

    def flag(self, names: frozenset[str]) -> Hit | None:
        for name in names:
            hits = self.flags.get(name)
            if hits:
                return hits[0]
        return None

    def has(self, names: frozenset[str]) -> bool:
        return any(self.flags.get(n) for n in names)

    def _env_index(self) -> dict[str, EnvVar]:
        if self._envs is None:
            self._envs = {}
            for _, c in self.containers:
                for var in c.env:
                    self._envs.setdefault(var.name, var)
        return self._envs

    def env(self, knob: str, cache: ClusterCache) -> Found | None:
        index = self._env_index()
        if not index:
            return None
        for name in ENV.get(knob, ()):
            var = index.get(name)
            if var is not None:
                if var.value is not None:
                    return Found(var.value, "env", f"env {var.name}")
                if var.config_map:
                    data = cache.config_map(self.view.namespace, var.config_map[0])
                    if data is None:
                        self.warnings.append(
                            f"cache miss: ConfigMap {var.config_map[0]} for env {var.name}"
                        )
                    elif var.config_map[1] in data:
                        return Found(data[var.config_map[1]], "env-configmap", f"env {var.name}")
        return None

    def lookup(self, knob: str, annotation: str | None, cache: ClusterCache) -> Found | None:
        """The first statement of ``knob``: annotation, Megatron flag, HF flag, env, DeepSpeed."""
        if annotation and annotation in self.view.annotations:
            return Found(self.view.annotations[annotation], "annotation", annotation)
        for origin, table in (("megatron", MEGATRON), ("hf", HF)):
            hit = self.flag(table.get(knob, _NO_NAMES))
            if hit is not None and hit.value is not None:
                return Found(hit.value, origin, hit.flag)
        found = self.env(knob, cache)
        if found is not None:
            return found
        ds_key = DS_CONFIG.get(knob)
        if ds_key and self.deepspeed is not None:
            value = self.deepspeed.get(ds_key)
            if isinstance(value, int) and not isinstance(value, bool):
                return Found(str(value), "deepspeed", f"DeepSpeed {ds_key}")
        return None


def _index(
    containers: list[tuple[PodSetView, ContainerView]], warnings: list[str]
) -> dict[str, list[Hit]]:
    flags: dict[str, list[Hit]] = {}
    for _, c in containers:
        for hit in find(c, _ALL):
            flags.setdefault(hit.flag, []).append(hit)
    for name, hits in flags.items():
        if len({h.value for h in hits}) > 1:
            warnings.append(f"{name} differs between containers; using {hits[0].value}")
    return flags


def _deepspeed(src: Sources, cache: ClusterCache) -> Mapping[str, Any] | None:
    hit = src.flag(HF["deepspeed"])
    if hit is None or not hit.value or hit.value.startswith("{"):
        return None
    path = hit.value
    for ps, c in src.containers:
        for vol, mount in c.mounts:
            prefix = mount.rstrip("/") + "/"
            if not path.startswith(prefix) or vol not in ps.config_map_volumes:
                continue
            cm_name, items = ps.config_map_volumes[vol]
            rel = path[len(prefix) :]
            key = next((k for k, p in items.items() if p == rel), rel)
            data = cache.config_map(src.view.namespace, cm_name)
            if data is None:
                src.warnings.append(f"cache miss: ConfigMap {cm_name} holding the DeepSpeed config")
                return None
            try:
                doc = json.loads(data.get(key, ""))
            except ValueError:
                src.problems.append(f"ConfigMap {cm_name} key {key} is not DeepSpeed JSON")
                return None
            return doc if isinstance(doc, Mapping) else None
    src.warnings.append(f"DeepSpeed config {path} is not mounted from a ConfigMap; not read")
    return None


def read_sources(view: JobView, cache: ClusterCache) -> Sources:
    """Collect flags from every GPU container of the job, and its DeepSpeed JSON if mounted."""
    containers = [(ps, c) for ps in view.training_sets for c in ps.containers if c.gpus > 0]
    src = Sources(view=view, containers=containers)
    src.flags = _index(containers, src.warnings)
    src.deepspeed = _deepspeed(src, cache)
    return src


def positive(found: Found | None, knob: str) -> int | None:
    """Parse a positive integer statement; raise ``ConfigError`` naming where it came from."""
    if found is None:
        return None
    text = found.value.strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            found.where,
            f"{knob} {found.value!r} is not a positive integer",
            f"set {found.where} to a whole number >= 1",
        )
    return int(text)


def switch(src: Sources, name: str) -> bool:
    hit = src.flag(SWITCHES[name])
    return hit is not None and (hit.value is None or hit.value.lower() in {"1", "true", "yes"})
