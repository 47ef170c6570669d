"""Host memory is a verdict in admission: offloaded states against the pod's memory limit, else
the reference node's memory (assumed and said), else a warning that names what was missing."""

from __future__ import annotations

import copy

import pytest
from admission_helpers import cluster_cache, load

from dssup.admission import Policy
from dssup.admission.podspec import memory_bytes

JOB = "pytorchjob-zero-infinity.yaml"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(cluster_cache())


def _with_limit(limit: str | None, product: str = "NVIDIA-H100-80GB-HBM3") -> dict:
    obj = copy.deepcopy(load(JOB))
    pod = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["nodeSelector"] = {"nvidia.com/gpu.product": product}
    limits = pod["containers"][0]["resources"]["limits"]
    limits.pop("memory")
    if limit is not None:
        limits["memory"] = limit
    return obj


def test_over_the_pod_limit_is_denied_with_the_terms(policy: Policy) -> None:
    d = policy.judge(_with_limit("16Gi"), "team-a", "validate")
    assert not d.allowed and d.code == "predicted-host-oom"
    assert "host memory needed 123.4 GiB per pod" in d.message
    for term in (
        "optimizer offload",
        "pinned buffers",
        "FP32 gradient partition",
        "parameter offload",
    ):
        assert term in d.message
    assert "exceeds 16.0 GiB (the GPU container's memory limit)" in d.message
    assert "raise the memory limit to at least 123.4 GiB" in d.message
    warn = policy.judge(_with_limit("16Gi"), "team-a", "warn")
    assert warn.allowed and warn.code == "predicted-host-oom" and warn.warnings


def test_within_the_pod_limit_fits_and_says_so(policy: Policy) -> None:
    d = policy.judge(_with_limit("800Gi"), "team-a", "validate")
    assert d.allowed and d.code == "fits"
    assert "fits 800.0 GiB (the GPU container's memory limit)" in d.message


def test_no_limit_is_judged_against_the_reference_node_and_says_assumed(policy: Policy) -> None:
    d = policy.judge(_with_limit(None), "team-a", "validate")
    assert d.allowed and d.code == "fits"
    assert "per node" in d.message and "reference node, assumed" in d.message


def test_no_limit_and_no_known_node_is_allowed_with_a_warning(policy: Policy) -> None:
    """A GPU whose reference node's memory the table does not know: never a denial."""
    d = policy.judge(_with_limit(None, "NVIDIA-L40S"), "team-a", "validate")
    assert d.allowed, d.message
    assert any("not checked" in w and "resources.limits.memory" in w for w in d.warnings)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 << 30),
        ("16G", 16 * 10**9),
        ("1.5Gi", 3 << 29),
        ("17179869184", 17179869184),
        ("1e9", 10**9),
        ("128974848", 128974848),
        ("129e6", 129 * 10**6),
        ("123Mi", 123 << 20),
        ("500m", 1),  # milli-bytes round up to a byte
        (1024, 1024),
        ("16 Gi", None),
        ("-1Gi", None),
        ("1e400", None),
        ("Gi", None),
        (None, None),
        (True, None),
    ],
)
def test_memory_quantities_read_as_kubernetes_does(text: object, expected: int | None) -> None:
    assert memory_bytes(text) == expected
