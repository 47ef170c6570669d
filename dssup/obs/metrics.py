"""Metrics behind a small interface with a null default, so library code never needs a registry.

``PrometheusMetrics`` registers the documented series in its own ``CollectorRegistry`` (tests
create as many as they like) and can render the text format or write a textfile atomically
(node-exporter's textfile collector reads it).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

CacheStats = Mapping[str, tuple[int, int, int]]  # cache -> (hits, misses, entries)

__all__ = ["Metrics", "NullMetrics", "PrometheusMetrics"]


class Metrics(Protocol):
    def admission_request(self, kind: str, decision: str, code: str, seconds: float) -> None: ...
    def supervisor_attempt(self, failure_kind: str) -> None: ...
    def supervisor_recovery(self, seconds: float) -> None: ...
    def estimate_peak(self, model: str, peak_bytes: int) -> None: ...


class NullMetrics:
    """Discards everything; the default."""

    def admission_request(self, kind: str, decision: str, code: str, seconds: float) -> None:
        return None

    def supervisor_attempt(self, failure_kind: str) -> None:
        return None

    def supervisor_recovery(self, seconds: float) -> None:
        return None

    def estimate_peak(self, model: str, peak_bytes: int) -> None:
        return None


class PrometheusMetrics:
    """The documented series on a private registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._requests = Counter(
            "dssup_admission_requests",
            "Admission reviews answered.",
            ["kind", "decision", "code"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "dssup_admission_request_duration_seconds",
            "Time to decide one review.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0),
            registry=self.registry,
        )
        self._attempts = Counter(
            "dssup_supervisor_attempts",
            "Attempts ended, by failure kind.",
            ["failure_kind"],
            registry=self.registry,
        )
        self._recovery = Histogram(
            "dssup_supervisor_recovery_seconds",
            "Worker death to relaunched torchrun.",
            registry=self.registry,
        )
        self._peak = Gauge(
            "dssup_estimate_peak_bytes",
            "Predicted per-GPU peak.",
            ["model"],
            registry=self.registry,
        )

    def admission_request(self, kind: str, decision: str, code: str, seconds: float) -> None:
        self._requests.labels(kind, decision, code).inc()
        self._duration.observe(seconds)

    def supervisor_attempt(self, failure_kind: str) -> None:
        self._attempts.labels(failure_kind).inc()

    def supervisor_recovery(self, seconds: float) -> None:
        self._recovery.observe(seconds)

    def estimate_peak(self, model: str, peak_bytes: int) -> None:
        self._peak.labels(model).set(peak_bytes)

    def track_caches(self, stats: Callable[[], CacheStats]) -> None:
        """Expose in-memory caches, read at scrape time (nothing on the request path):
        ``dssup_admission_cache_lookups_total{cache,result}`` and
        ``dssup_admission_cache_entries{cache}``."""
        self.registry.register(_CacheCollector(stats))

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    def write_textfile(self, path: Path) -> None:
        """Write the text format atomically (temp file + rename in the same directory)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.render())
        os.replace(tmp, path)


class _CacheCollector:
    """A prometheus_client collector over a stats callable."""

    def __init__(self, stats: Callable[[], CacheStats]) -> None:
        self.stats = stats

    def describe(self) -> list[Any]:
        return []  # unchecked: the families are built at collect time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        lookups = CounterMetricFamily(
            "dssup_admission_cache_lookups",
            "Lookups in the webhook's in-memory caches by result.",
            labels=["cache", "result"],
        )
        entries = GaugeMetricFamily(
            "dssup_admission_cache_entries", "Entries held.", labels=["cache"]
        )
        for name, (hits, misses, size) in sorted(self.stats().items()):
            lookups.add_metric([name, "hit"], hits)
            lookups.add_metric([name, "miss"], misses)
            entries.add_metric([name], size)
        yield lookups
        yield entries
