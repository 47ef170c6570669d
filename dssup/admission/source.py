"""Find a job's training config: annotations first, then Megatron/HF flags, env, DeepSpeed JSON.

The result names, for every knob, the value and the *kind* of place it came from, so the patch
writer can rewrite the same places and the messages can tell the user what to change. Anything
missing or contradictory is reported as a problem (the policy then allows with a warning)
rather than guessed, except documented defaults (e.g. Megatron's global batch = mbs x dp).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from dssup.admission import annotations as ann
from dssup.admission.argv import MAX_SCRIPT, Hit, find_launch
from dssup.admission.cache import ClusterCache
from dssup.admission.flags import DS_CONFIG, ENV, HF, MEGATRON, SWITCHES, all_names
from dssup.admission.view import ContainerView, EnvVar, JobView, PodSetView, annotation_ref
from dssup.errors import ConfigError, DssupError

__all__ = ["Found", "Incomplete", "Sources", "config_key", "positive", "read_sources", "switch"]

_ALL = all_names()
_FLAG_TABLES = (("megatron", MEGATRON), ("hf", HF))
_FLAG_KNOBS = frozenset(MEGATRON) | frozenset(HF)


class Incomplete(DssupError):
    """The job does not state enough to be judged; ``missing`` says what to add."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__("; ".join(missing))


class Found(NamedTuple):
    """A value and the kind of place it came from (annotation, megatron, hf, env, deepspeed).
    Immutable (some are cached per launch line and shared) and cheap to build."""

    value: str
    origin: str
    where: str


@dataclass(slots=True)
class Sources:
    """Every raw value the job states, by knob, in priority order."""

    view: JobView
    containers: list[tuple[PodSetView, ContainerView]]
    flags: Mapping[str, Sequence[Hit]] = field(default_factory=dict)
    deepspeed: Mapping[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _envs: dict[str, tuple[PodSetView, EnvVar]] | None = None
    _by_knob: Mapping[str, Found] = field(default_factory=dict)
    launch: tuple[
        tuple[tuple[str, ...], tuple[str, ...]], ...
    ] = ()  # (command, args) per GPU container
    deepspeed_inline: Hit | None = None  # the flag holding inline DeepSpeed JSON, if any

    def value(self, names: frozenset[str]) -> str | None:
        """The value of the statement of ``names`` that counts (the last), if any."""
        hit = _first(self.flags, names)
        return hit.value if hit is not None else None

    def literal_env(self, name: str) -> str | None:
        """A literal env value of the GPU containers (the first container stating it)."""
        found = self._env_index().get(name)
        return found[1].value if found is not None else None

    def flag(self, names: frozenset[str]) -> Hit | None:
        return _first(self.flags, names)

    def has(self, names: frozenset[str]) -> bool:
        return any(self.flags.get(n) for n in names)

    def _env_index(self) -> dict[str, tuple[PodSetView, EnvVar]]:
        if self._envs is None:
            self._envs = {}
            for ps, c in self.containers:
                for var in c.env:
                    self._envs.setdefault(var.name, (ps, var))
        return self._envs

    def env(self, knob: str, cache: ClusterCache) -> Found | None:
        index = self._env_index()
        if not index:
            return None
        for name in ENV.get(knob, ()):
            found = index.get(name)
            if found is None:
                continue
            ps, var = found
            if var.value is not None:
                return Found(var.value, "env", f"env {var.name}")
            key = annotation_ref(var.field_ref)
            if key is not None and key in ps.annotations:
                return Found(ps.annotations[key], "downward", f"env {var.name} (annotation {key})")
            if var.config_map:
                data = cache.config_map(self.view.namespace, var.config_map[0])
                if data is None:
                    raise Incomplete(
                        [f"cache miss: ConfigMap {var.config_map[0]} for env {var.name}"]
                    )
                if var.config_map[1] in data:
                    return Found(data[var.config_map[1]], "env-configmap", f"env {var.name}")
        return None

    def lookup(self, knob: str, annotation: str | None, cache: ClusterCache) -> Found | None:
        """The first statement of ``knob``: annotation, Megatron flag, HF flag, env, DeepSpeed."""
        if annotation and annotation in self.view.annotations:
            return Found(self.view.annotations[annotation], "annotation", annotation)
        found = self._by_knob.get(knob)
        if found is not None:
            return found
        found = self.env(knob, cache)
        if found is not None:
            return found
        ds_key = DS_CONFIG.get(knob)
        if ds_key and self.deepspeed is not None:
            value = self.deepspeed.get(ds_key)
            if isinstance(value, int) and not isinstance(value, bool):
                return Found(str(value), "deepspeed", f"DeepSpeed {ds_key}")
        return None


def _position(hit: Hit) -> tuple[bool, int, str]:
    return hit.field == "args", hit.index, hit.flag


def _first(flags: Mapping[str, Sequence[Hit]], names: frozenset[str]) -> Hit | None:
    """The statement that counts among the spellings in ``names``: the last one on the launch
    line, as argparse and Megatron read a flag given twice (ties broken by spelling, so the
    answer does not depend on set iteration order)."""
    found = [hits[-1] for name in names if (hits := flags.get(name))]
    return max(found, key=_position) if found else None


@dataclass(frozen=True, slots=True)
class _Index:
    flags: Mapping[str, tuple[Hit, ...]]
    by_knob: Mapping[str, Found]  # the first Megatron, else HF, statement of each knob
    warnings: tuple[str, ...]
    deepspeed: Hit | None  # the DeepSpeed config flag, if any


@lru_cache(maxsize=1024)
def _index(launch: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]) -> _Index:
    """Flags of the GPU containers' launch lines (command, args). Cached: replicated pod
    templates and resubmitted jobs repeat the same launch lines while names and env change.
    The result is shared, so it is immutable (tuples, and mappings nobody writes to)."""
    lists: dict[str, list[Hit]] = {}
    for command, args in launch:
        for hit in find_launch(command, args, _ALL):
            lists.setdefault(hit.flag, []).append(hit)
    flags = {name: tuple(hits) for name, hits in lists.items()}
    warnings = tuple(
        f"{name} is given {len(hits)} times with different values; using the last, {hits[-1].value}"
        for name, hits in flags.items()
        if len({h.value for h in hits}) > 1
    )
    by_knob: dict[str, Found] = {}
    for knob in _FLAG_KNOBS:
        for origin, table in _FLAG_TABLES:
            first = _first(flags, table.get(knob, frozenset()))
            if first is not None and first.value is not None:
                by_knob[knob] = Found(first.value, origin, first.flag)
                break
    return _Index(flags, by_knob, warnings, _first(flags, HF["deepspeed"]))


def _inline(src: Sources, hit: Hit) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(hit.value or "")
    except ValueError:
        src.problems.append(f"{hit.flag} holds text that is not DeepSpeed JSON")
        return None
    if not isinstance(doc, Mapping):
        src.problems.append(f"{hit.flag} holds JSON that is not an object")
        return None
    src.deepspeed_inline = hit
    return doc


def _deepspeed(src: Sources, cache: ClusterCache, hit: Hit) -> Mapping[str, Any] | None:
    if not hit.value:
        return None
    if hit.value.lstrip().startswith("{"):
        return _inline(src, hit)
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
                src.problems.append(
                    f"cache miss: ConfigMap {cm_name} holding the DeepSpeed config {path} (is it "
                    "labelled dssup.io/watch=true?)"
                )
                return None
            try:
                doc = json.loads(data.get(key, ""))
            except ValueError:
                src.problems.append(f"ConfigMap {cm_name} key {key} is not DeepSpeed JSON")
                return None
            return doc if isinstance(doc, Mapping) else None
    src.problems.append(
        f"DeepSpeed config {path} is not mounted from a ConfigMap, so dssup cannot read its ZeRO "
        "stage and batch sizes (mount it from a ConfigMap or state them as dssup.io/ annotations)"
    )
    return None


def read_sources(
    view: JobView, cache: ClusterCache, sets: tuple[PodSetView, ...] | None = None
) -> Sources:
    """Collect flags from every GPU container of the job, and its DeepSpeed JSON if mounted.
    ``sets``: the view's ``training_sets`` when the caller has them already."""
    sets = view.training_sets if sets is None else sets
    containers = [(ps, c) for ps in sets for c in ps.containers if c.gpus > 0]
    if len(sets) != len(view.pod_sets):  # launchers without GPUs (an MPIJob's mpirun line)
        containers += [(ps, c) for ps in view.pod_sets for c in ps.containers if c.launcher]
    launch = tuple((c.command, c.args) for _, c in containers)
    oversized = [
        len(e) for command, args in launch for e in (*command, *args) if len(e) > MAX_SCRIPT
    ]
    index = _index(launch)
    src = Sources(
        view,
        containers,
        index.flags,
        None,
        [],
        list(index.warnings),
        None,
        index.by_knob,
        launch,
    )  # positional, in field order: a slotted dataclass from keywords costs more per review
    src.warnings.extend(n for n in view.notes if n.startswith("GPU from"))
    if oversized:
        src.problems.append(
            f"a launch line element of {max(oversized):,} bytes is over the {MAX_SCRIPT:,} bytes "
            "dssup reads; state the config as dssup.io/ annotations"
        )
    if index.deepspeed is not None:
        src.deepspeed = _deepspeed(src, cache, index.deepspeed)
    return src


_ENV_NAMES = frozenset(name for names in ENV.values() for name in names)


def config_key(src: Sources, world_size: int, generation: int) -> tuple[Any, ...] | None:
    """Everything ``resolve`` reads from ``src`` as a hashable key, so jobs that differ only in
    what no knob reads (names, images, unrelated env vars such as a run id) share one resolved
    config. None where ``resolve`` would read more than the key holds (a DeepSpeed JSON, env
    values behind ConfigMap references): those are resolved every time."""
    if src.deepspeed is not None:
        return None
    env: list[tuple[str, str]] = []
    for _, c in src.containers:
        for var in c.env:
            if var.name in _ENV_NAMES:
                if var.value is None:
                    return None
                env.append((var.name, var.value))
    notes = (tuple(src.problems), tuple(src.warnings))
    annotations = tuple((k, v) for k, v in src.view.annotations.items() if k.startswith(ann.PREFIX))
    return (src.launch, annotations, tuple(env), notes, world_size, src.view.namespace, generation)


def positive(found: Found | None, knob: str) -> int | None:
    """Parse a positive integer statement; raise ``ConfigError`` naming where it came from."""
    if found is None:
        return None
    text = found.value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(
            found.where,
            f"{knob} {found.value!r} is not a positive integer",
            f"set {found.where} to a whole number >= 1",
        )
    return int(text)


def switch(src: Sources, name: str) -> bool:
    hit = src.flag(SWITCHES[name])
    return hit is not None and (hit.value is None or hit.value.lower() in {"1", "true", "yes"})
