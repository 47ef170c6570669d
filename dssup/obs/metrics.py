"""Metrics behind a small interface with a null default, so library code never needs a registry.

``PrometheusMetrics`` registers the documented series in its own ``CollectorRegistry`` (tests
create as many as they like) and can render the text format or write a textfile atomically
(node-exporter's textfile collector reads it).
"""

from __future__ import annotations

import bisect
import math
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
        self._admission = _AdmissionTally(ADMISSION_BUCKETS)
        self.registry.register(self._admission)
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
        self._admission.add(kind, decision, code, seconds)

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


ADMISSION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class _ScrapeTime:
    """A prometheus_client collector whose metric families are built when scraped."""

    def describe(self) -> list[Any]:
        return []  # unchecked: the families are built at collect time


class _AdmissionTally(_ScrapeTime):
    """``dssup_admission_requests_total{kind,decision,code}`` and the histogram
    ``dssup_admission_request_duration_seconds``, kept as plain numbers on the request path and
    turned into metric families at scrape time. prometheus_client's labelled Counter and
    Histogram take a lock and about 4.5 µs per review on the 2-core development VM, a fifth
    of a remembered decision. Not thread-safe: the webhook answers and is scraped on one event loop.
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # upper bounds; +Inf is implied
        self.counts: dict[tuple[str, str, str], int] = {}
        self.buckets = [0] * (len(bounds) + 1)
        self.total_seconds = 0.0

    def add(self, kind: str, decision: str, code: str, seconds: float) -> None:
        key = (kind, decision, code)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1  # le: value <= bound
        self.total_seconds += seconds

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        requests = CounterMetricFamily(
            "dssup_admission_requests",
            "Admission reviews answered.",
            labels=["kind", "decision", "code"],
        )
        for key, n in sorted(self.counts.items()):
            requests.add_metric(list(key), n)
        yield requests
        running, buckets = 0, []
        for bound, n in zip((*self.bounds, math.inf), self.buckets, strict=True):
            running += n
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), running))
        yield HistogramMetricFamily(
            "dssup_admission_request_duration_seconds",
            "Time to decide one review.",
            buckets=buckets,
            sum_value=self.total_seconds,
        )


class _CacheCollector(_ScrapeTime):
    """A prometheus_client collector over a stats callable."""

    def __init__(self, stats: Callable[[], CacheStats]) -> None:
        self.stats = stats

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
