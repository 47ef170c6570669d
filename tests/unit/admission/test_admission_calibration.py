"""``dssup.io/calibration: configmap:<name>/<key>``: a job judged with its team's traced profile.

The profile is a real one (tests/fixtures/admission/profiles/SOURCE.md: `dssup calibrate --hf` of
the llama-3-8b preset's config), held in a ConfigMap of the in-memory cluster cache like the
model ConfigMaps of cluster.yaml (no kube-apiserver exists here).
"""

from pathlib import Path

import pytest
from admission_helpers import cluster_cache, load

from dssup.admission import Policy
from dssup.admission.calibration import CALIBRATION, calibration
from dssup.admission.config import Incomplete
from dssup.errors import ConfigError
from dssup.memory.traced import TracedProfile

PROFILE = Path(__file__).parents[2] / "fixtures" / "admission" / "profiles"
TEXT = (PROFILE / "llama-3-8b.bf16.sdpa.json").read_text()


def _cache(data: dict[str, str]):
    cache = cluster_cache()
    meta = {"name": "llama-profile", "namespace": "team-a"}
    cache.upsert({"kind": "ConfigMap", "metadata": meta, "data": data})
    return cache


def test_the_annotation_names_a_configmap_key_holding_a_profile() -> None:
    cache = _cache({"profile.json": TEXT})
    ann = {CALIBRATION: "configmap:llama-profile/profile.json"}
    prof = calibration(ann, "team-a", cache)
    assert isinstance(prof, TracedProfile) and prof.blocks == {"dense": 32}
    assert calibration({}, "team-a", cache) is None


@pytest.mark.parametrize(
    ("value", "data", "error", "match"),
    [
        ("llama-profile/profile.json", {}, ConfigError, "is not configmap:<name>/<key>"),
        ("configmap:llama-profile/other.json", {"profile.json": "{}"}, ConfigError, "no key"),
        ("configmap:llama-profile/profile.json", {"profile.json": "{"}, ConfigError, "not JSON"),
        (
            "configmap:llama-profile/profile.json",
            {"profile.json": '{"kind": "traced", "version": 7}'},
            ConfigError,
            "format 7",
        ),
        ("configmap:absent/profile.json", {}, Incomplete, "cache miss: ConfigMap absent"),
    ],
)
def test_bad_references_name_the_annotation(value, data, error, match) -> None:
    with pytest.raises(error, match=match) as info:
        calibration({CALIBRATION: value}, "team-a", _cache(data))
    if error is ConfigError:
        assert info.value.field == CALIBRATION


def test_the_webhook_judges_the_job_with_the_profile() -> None:
    obj = load("job-annotations.yaml")  # llama-3-8b, micro-batch 16, sequence 4096, 16 GPUs
    plain = Policy(cluster_cache()).judge(obj, "team-a", "validate")
    obj["metadata"]["annotations"][CALIBRATION] = "configmap:llama-profile/profile.json"
    traced = Policy(_cache({"profile.json": TEXT})).judge(obj, "team-a", "validate")
    assert plain.code == traced.code == "predicted-oom"
    # transformers' unfused loss keeps three fp32 b*s*v tensors: more than the convention's
    assert _activations(traced.message) > _activations(plain.message)
    # the remedy is planned with the profile: another micro-batch, only the levels it traced
    assert _closest(traced.message) != _closest(plain.message)
    assert "selective" not in traced.message


def _closest(message: str) -> str:
    return message.split("closest fitting config: ")[1].split(";", maxsplit=1)[0]


def _activations(message: str) -> float:
    return float(message.split("activations ")[1].split(",", maxsplit=1)[0])
