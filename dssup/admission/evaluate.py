"""From an object to a judged config: normalise, read the config, find the GPU, estimate.

Returns either an ``Evaluation`` or an early ``Decision`` for objects that cannot or need not be
judged (no GPUs, unknown kind, incomplete config, unknown GPU, cache miss). Estimates are kept
in a bounded LRU keyed by (model, layout, training, usable bytes): the same job is judged by the
mutating webhook, again after re-invocation and by the validating webhook, and replicated
templates are common, so the 2-10 ms of a DeepSeek-V3 estimate is paid once per config.

A job never seen before is usually a known template under a new name or run id: what its
config, GPU and estimate are (a ``Judged``) is remembered by ``config_key`` plus the GPU
products, so such a job costs only its reading (normalise, sources, key), not the resolution.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple, TypeVar

from dssup.admission.cache import ClusterCache
from dssup.admission.config import Incomplete, JobConfig, resolve
from dssup.admission.decision import Decision
from dssup.admission.gpus import GpuMemory, resolve_gpu
from dssup.admission.kinds import identify, is_controlled, normalise
from dssup.admission.memo import Versioned, content, memo_key
from dssup.admission.settings import PolicySettings
from dssup.admission.source import Sources, config_key, read_sources
from dssup.admission.view import JobView
from dssup.memory import Estimate, Layout, Training, estimate

__all__ = ["LRU", "Evaluation", "Evaluator", "Judged", "Leftovers"]

T = TypeVar("T")


class Leftovers:
    """What answering leaves behind (parsed requests, evicted memo entries), freed later.

    Freeing a review's objects (a parsed job, the views and sources of an evicted evaluation)
    is a sizeable part of a fresh job's cost. The server frees them after the answer is written
    (``Adapter.tidy``), so that is in no request's latency. Bounded: past ``limit`` items, or
    for a caller that never tidies (``dssup admit``), things are freed at once as usual."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._items: list[Any] = []

    def keep(self, item: Any) -> None:
        if len(self._items) < self.limit:
            self._items.append(item)

    def __len__(self) -> int:
        return len(self._items)

    def release(self) -> None:
        self._items.clear()


class LRU:
    """A small least-recently-used map (OrderedDict). Large reviews are judged on a worker
    thread while the event loop answers small ones, so reads and writes take a lock (held
    only for the dict operations, never while a value is computed). Evicted entries go to
    ``leftovers`` when given (freed after the answer is written)."""

    def __init__(self, size: int, leftovers: Leftovers | None = None) -> None:
        self.size = size
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._leftovers = leftovers
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
        return value

    def remember(self, key: Hashable | None, make: Callable[[], T]) -> T:
        """The value kept for ``key``, else ``make()``, kept. Nothing is kept when ``make``
        raises (failures are not remembered), or for the key None (nothing to key it by)."""
        if key is None:
            return make()
        found: T | None = self.get(key)
        if found is None:
            found = make()
            self.put(key, found)
        return found

    def stats(self) -> tuple[int, int, int]:
        """(hits, misses, entries)."""
        return self.hits, self.misses, len(self._data)

    def put(self, key: Hashable, value: Any) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                evicted = self._data.popitem(last=False)
                if self._leftovers is not None:
                    self._leftovers.keep(evicted)


class Judged(NamedTuple):
    """What a config is (resolved config, GPU, estimate): shared by every job with its key."""

    cfg: JobConfig
    gpu: GpuMemory
    est: Estimate


class Evaluation(NamedTuple):
    """A job that could be judged, with everything needed to explain and to resize it.
    ``key`` names its ``Judged`` (None when not remembered): answers that depend on nothing
    else may be remembered under it."""

    view: JobView
    src: Sources
    cfg: JobConfig
    gpu: GpuMemory
    est: Estimate
    key: Hashable | None = None


def _allow(code: str, message: str, *warnings: str) -> Decision:
    return Decision(
        allowed=True, code=code, message=message, warnings=tuple(w[:256] for w in warnings)
    )


class Evaluator:
    """Judges objects against a cluster cache; shared by the webhook and ``dssup admit``."""

    def __init__(
        self, cache: ClusterCache, settings: PolicySettings, leftovers: Leftovers | None = None
    ) -> None:
        self.cache = cache
        self.settings = settings
        self._estimates = LRU(settings.estimate_cache_size)
        self._generation = cache.generation if isinstance(cache, Versioned) else None
        size = settings.judgement_cache_size if self._generation else 0
        self._evaluations = LRU(size, leftovers)
        self._judged = LRU(size, leftovers)

    def cache_stats(self) -> dict[str, tuple[int, int, int]]:
        """(hits, misses, entries) of the evaluation, judged-config and estimate caches."""
        return {
            "evaluations": self._evaluations.stats(),
            "configs": self._judged.stats(),
            "estimates": self._estimates.stats(),
        }

    def estimate(self, cfg: JobConfig, layout: Layout, training: Training, usable: int) -> Estimate:
        return self._estimates.remember(
            (cfg.model_key, layout, training, usable),
            lambda: estimate(
                cfg.model,
                layout,
                training,
                convention=self.settings.convention,
                gpu_memory_bytes=usable,
            ),
        )

    def evaluate(
        self, obj: Mapping[str, Any], namespace: str, raw: bytes | None = None, *, keep: bool = True
    ) -> Evaluation | Decision:
        """Judge ``obj``; raise ``ConfigError`` for a config that contradicts itself. Results are
        remembered by content (``memo.py``; ``raw`` is that content when the caller has it): the
        validating webhook re-reads what the mutating one read, plus annotations no evaluation
        reads. ``keep=False`` looks up without keeping: for a caller whose next look at the same
        content is answered by its own decision memo (the validating webhook), keeping would only
        evict something useful."""
        if self._generation is None or self._evaluations.size <= 0:
            return self._evaluate(obj, namespace)
        if raw is None:
            raw = content(obj, namespace, self._generation(), keep_written=False)
            if raw is None:
                return self._evaluate(obj, namespace)
        key = memo_key("evaluate", raw)
        if keep:
            return self._evaluations.remember(key, lambda: self._evaluate(obj, namespace))
        found: Evaluation | Decision | None = self._evaluations.get(key)
        return self._evaluate(obj, namespace) if found is None else found

    def _evaluate(self, obj: Mapping[str, Any], namespace: str) -> Evaluation | Decision:
        reader, why = identify(obj)
        if reader is None:
            return _allow("unsupported-kind", f"not judged: {why}", f"dssup: not judged: {why}")
        if reader.kind == "Pod" and is_controlled(obj):
            return _allow("not-applicable", "a controlled Pod is judged at its owner")
        view = normalise(obj, self.cache, namespace)
        missed = [n for n in view.notes if n.startswith("cache miss")]
        unreadable = [n[len("unreadable: ") :] for n in view.notes if n.startswith("unreadable:")]
        found = self._judge_view(view)
        if missed and isinstance(found, Decision):
            return _allow(
                "cache-miss", f"not judged: {missed[0]}", f"dssup: not judged: {missed[0]}"
            )
        if unreadable and isinstance(found, Decision) and found.code == "not-applicable":
            what = "; ".join(unreadable)
            return _allow(
                "config-incomplete",
                f"not judged: a GPU request or replica count is not a number: {what}",
                f"dssup: not judged: GPU request or replica count not a number ({what})",
            )
        return found

    def _key(self, src: Sources, world_size: int, products: tuple[str, ...]) -> Hashable | None:
        """``config_key`` plus the GPU products: all a ``Judged`` depends on (the settings are
        the evaluator's own). None where nothing is remembered."""
        if self._generation is None or self._judged.size <= 0:
            return None
        key = config_key(src, world_size, self._generation())
        return None if key is None else (key, products)

    def _judge_view(self, view: JobView) -> Evaluation | Decision:
        sets = view.training_sets
        if not sets:
            return _allow("not-applicable", "no container requests nvidia.com/gpu")
        src = read_sources(view, self.cache, sets)
        products = tuple(p for ps in sets for p in ps.gpu_products)
        if not products and self.settings.default_gpu_product:
            products = (self.settings.default_gpu_product,)
        world = view.world_size
        key = self._key(src, world, products)
        # A ConfigError raises out of ``remember``: failures are not remembered.
        found = self._judged.remember(key, lambda: self._judge_config(src, world, products))
        if isinstance(found, Decision):
            return found
        return Evaluation(view, src, found.cfg, found.gpu, found.est, key)

    def _judge_config(
        self, src: Sources, world_size: int, products: tuple[str, ...]
    ) -> Judged | Decision:
        try:
            cfg = resolve(src, self.cache, world_size)
        except Incomplete as exc:
            code = (
                "cache-miss"
                if any(m.startswith("cache miss") for m in exc.missing)
                else "config-incomplete"
            )
            return _allow(
                code, f"not judged: {exc}", *(f"dssup: not judged: {m}" for m in exc.missing)
            )
        gpu = resolve_gpu(products, self.cache, self.settings.reserve_bytes)
        if gpu is None:
            what = ", ".join(products) or (
                "no GPU product: the node selector names none dssup can resolve (add "
                "nvidia.com/gpu.product)"
            )
            return _allow(
                "unknown-gpu",
                f"GPU memory unknown ({what})",
                f"dssup: not judged: GPU memory unknown ({what[:90]})",
            )
        return Judged(cfg, gpu, self.estimate(cfg, cfg.layout, cfg.training, gpu.usable_bytes))
