"""The webhook's request series, kept as plain numbers and rendered at scrape time.

``dssup_admission_requests_total`` and ``dssup_admission_request_duration_seconds`` must read
exactly like a prometheus_client Counter and Histogram would (same names, labels, cumulative
``le`` buckets where a value equal to a bound counts in that bucket, ``_count`` and ``_sum``),
checked by parsing the text format with prometheus_client's own parser.
"""

from prometheus_client.parser import text_string_to_metric_families

from dssup.obs.metrics import ADMISSION_BUCKETS, PrometheusMetrics


def _samples(metrics: PrometheusMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counts_and_buckets_read_like_a_counter_and_a_histogram() -> None:
    metrics = PrometheusMetrics()
    for seconds in (0.00005, ADMISSION_BUCKETS[0], 0.0003, 2.0):
        metrics.admission_request("PyTorchJob", "allowed", "fits", seconds)
    metrics.admission_request("Job", "denied", "predicted-oom", 0.001)
    got = _samples(metrics)
    fits = (("code", "fits"), ("decision", "allowed"), ("kind", "PyTorchJob"))
    oom = (("code", "predicted-oom"), ("decision", "denied"), ("kind", "Job"))
    assert got[("dssup_admission_requests_total", fits)] == 4
    assert got[("dssup_admission_requests_total", oom)] == 1
    bucket = "dssup_admission_request_duration_seconds_bucket"
    assert got[(bucket, (("le", "0.0001"),))] == 2  # 50 µs and exactly 100 µs
    assert got[(bucket, (("le", "0.0005"),))] == 3
    assert got[(bucket, (("le", "0.001"),))] == 4  # 1 ms is at the bound
    assert got[(bucket, (("le", "1.0"),))] == 4
    assert got[(bucket, (("le", "+Inf"),))] == 5
    assert got[("dssup_admission_request_duration_seconds_count", ())] == 5
    assert abs(got[("dssup_admission_request_duration_seconds_sum", ())] - 2.00145) < 1e-9


def test_series_exist_before_the_first_review() -> None:
    got = _samples(PrometheusMetrics())
    assert got[("dssup_admission_request_duration_seconds_count", ())] == 0
    assert not [k for k in got if k[0] == "dssup_admission_requests_total"]
