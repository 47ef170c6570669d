"""Remembered judgements: hits where a job comes back unchanged, never a stale or wrong answer.

The rule under test (dssup/admission/memo.py): a decision depends only on what the key covers.
Checked directly (hypothesis: objects that differ only in what the key leaves out get equal
decisions from a policy without memory, and a policy with memory always answers like one
without) and through the cluster cache's generation (a real change invalidates, a Node
heartbeat or an unchanged ConfigMap does not).
"""

import copy
from typing import Any

import jsonpatch
from admission_helpers import cluster_cache, cluster_docs, job_files, load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dssup.admission import Policy
from dssup.admission.memo import RAW_KEY_MAX, VOLATILE_META, WRITTEN, content, memo_key
from dssup.admission.settings import PolicySettings
from dssup.obs.metrics import PrometheusMetrics

NS = "team-a"
NO_MEMO = PolicySettings(judgement_cache_size=0)


class Counting(Policy):
    """A real policy that counts how often the evaluation really runs (no fake involved)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs = 0
        real = self.evaluator._evaluate

        def counted(obj: Any, namespace: str) -> Any:
            self.runs += 1
            return real(obj, namespace)

        self.evaluator._evaluate = counted  # type: ignore[method-assign]


def _node(name: str, product: str, memory: str, heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": memory},
        },
        "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": heartbeat}]},
    }


def test_repeats_and_validate_after_mutate_evaluate_once() -> None:
    policy = Counting(cluster_cache())
    job = load("pytorchjob-dsv3-fits.yaml")
    first = policy.judge(job, NS, "mutate")
    assert first.code == "fits" and first.patch
    assert policy.judge(copy.deepcopy(job), NS, "mutate") == first  # reinvocation
    admitted = jsonpatch.apply_patch(job, list(first.patch))
    admitted["metadata"] |= {"uid": "u-1", "resourceVersion": "7", "name": "other-name"}
    validated = policy.judge(admitted, NS, "validate")
    assert validated.allowed and validated.code == "fits"
    assert policy.runs == 1  # mutate, its re-invocation and validate: one evaluation
    assert policy.judge(admitted, NS, "mutate").patch == ()  # idempotent on its own output
    stats = policy.cache_stats()
    assert stats["decisions"][0] == 1 and stats["evaluations"][0] >= 2


def test_cache_series_are_scraped_from_the_policy() -> None:
    policy = Policy(cluster_cache())
    metrics = PrometheusMetrics()
    metrics.track_caches(policy.cache_stats)
    job = load("pytorchjob-dsv3-fits.yaml")
    for _ in range(3):
        policy.judge(job, NS, "validate")
    text = metrics.render().decode()
    assert 'dssup_admission_cache_lookups_total{cache="decisions",result="hit"} 2.0' in text
    assert 'dssup_admission_cache_lookups_total{cache="decisions",result="miss"} 1.0' in text
    # Only the mutating webhook keeps evaluations (the validating one is answered from its own
    # decision memo next time); the verdict of the fit is kept under the config's key.
    assert 'dssup_admission_cache_entries{cache="evaluations"} 0.0' in text
    assert 'dssup_admission_cache_entries{cache="verdicts"} 1.0' in text
    policy.judge(job, NS, "mutate")
    text = metrics.render().decode()
    assert 'dssup_admission_cache_entries{cache="evaluations"} 1.0' in text


def test_a_real_change_in_the_cluster_invalidates() -> None:
    cache = cluster_cache()
    policy = Counting(cache)
    job = load("pytorchjob-dsv3-fits.yaml")
    product = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"][
        "nvidia.com/gpu.product"
    ]
    assert policy.judge(job, NS, "validate").allowed
    gen = cache.generation()
    for doc in cluster_docs():  # the watch re-delivers every object unchanged (heartbeats)
        cache.upsert({**doc, "status": {"heartbeat": "later"}})
    assert cache.generation() == gen
    assert policy.judge(job, NS, "validate").allowed and policy.runs == 1
    cache.upsert(_node("small-001", product, "16384"))  # a smaller GPU of that product joins
    assert cache.generation() > gen
    after = policy.judge(job, NS, "validate")
    assert not after.allowed and after.code in {"predicted-oom", "no-feasible-plan"}
    assert policy.runs == 2
    cache.delete("Node", "", "small-001")
    assert policy.judge(job, NS, "validate").allowed


def test_configmap_change_bumps_generation_only_when_data_changes() -> None:
    cache = cluster_cache()
    cm = {"kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS}, "data": {"k": "1"}}
    cache.upsert(cm)
    gen = cache.generation()
    cache.upsert({**cm, "metadata": {**cm["metadata"], "resourceVersion": "9"}})
    assert cache.generation() == gen
    cache.upsert({**cm, "data": {"k": "2"}})
    assert cache.generation() == gen + 1


def test_unhashable_objects_are_judged_without_memory() -> None:
    obj = {"kind": "Pod", "spec": {"containers": [{"name": "c", "args": [{1, 2}]}]}}
    assert content(obj, NS, 0, keep_written=False) is None
    assert Policy(cluster_cache()).judge(obj, NS, "validate").allowed


_JOBS = [load(name) for name in job_files()]
_noise = st.fixed_dictionaries(
    {
        "meta": st.dictionaries(st.sampled_from(sorted(VOLATILE_META)), st.text(max_size=8)),
        "foreign": st.dictionaries(st.sampled_from(["a.example/x", "kueue/q"]), st.text()),
        "written": st.dictionaries(st.sampled_from(sorted(WRITTEN)), st.text(max_size=8)),
        "status": st.text(max_size=8),
    }
)


def _perturb(job: dict[str, Any], noise: dict[str, Any], written: bool) -> dict[str, Any]:
    out = copy.deepcopy(job)
    meta = out.setdefault("metadata", {})
    meta.update(noise["meta"])
    meta.setdefault("annotations", {}).update(noise["foreign"])
    if written:
        meta["annotations"].update(noise["written"])
    out["status"] = {"note": noise["status"]}
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(_JOBS))),
    st.sampled_from(["mutate", "validate", "warn"]),
    st.lists(_noise, min_size=2, max_size=4),
)
def test_what_the_key_leaves_out_never_changes_a_decision(i: int, mode: Any, noises: Any) -> None:
    cache = cluster_cache()
    plain, remembering = Policy(cache, NO_MEMO), Policy(cache)
    job = copy.deepcopy(_JOBS[i])
    job["metadata"].setdefault("annotations", {})["dssup.io/seed"] = "x"  # annotations present
    base = plain.judge(job, NS, mode)
    for noise in noises:
        variant = _perturb(job, noise, written=mode != "mutate")
        assert plain.judge(variant, NS, mode) == base
        assert remembering.judge(variant, NS, mode) == base


def _with_env(job: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    out = copy.deepcopy(job)
    for spec in out["spec"]["pytorchReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c.setdefault("env", []).append({"name": name, "value": value})
    return out


def test_a_fresh_job_of_a_known_template_reuses_its_resolved_config() -> None:
    policy = Policy(cluster_cache())
    job = load("pytorchjob-dsv3-fits.yaml")
    first = policy.judge(_with_env(job, "RUN_ID", "1"), NS, "validate")
    second = policy.judge(_with_env(job, "RUN_ID", "2"), NS, "validate")
    assert first == second and policy.cache_stats()["configs"][:2] == (1, 1)
    # An env var a knob reads is part of the key: a new micro-batch is resolved anew.
    smaller = policy.judge(_with_env(job, "DSSUP_MICRO_BATCH_SIZE", "1"), NS, "validate")
    assert policy.cache_stats()["configs"][:2] == (1, 2)
    plain = Policy(cluster_cache(), NO_MEMO)
    assert smaller == plain.judge(_with_env(job, "DSSUP_MICRO_BATCH_SIZE", "1"), NS, "validate")


def test_a_fresh_job_of_a_known_config_gets_the_answer_already_built() -> None:
    policy = Policy(cluster_cache())
    job = load("pytorchjob-dsv3-fits.yaml")
    answers = [policy.judge(_with_env(job, "RUN_ID", str(i)), NS, "validate") for i in range(3)]
    assert answers[0].code == "fits" and answers[1:] == answers[:2]
    assert policy.cache_stats()["verdicts"][:2] == (2, 1)  # built once, then reused
    patches = [policy.judge(_with_env(job, "RUN_ID", str(i)), NS, "mutate") for i in range(3)]
    assert policy.cache_stats()["verdicts"][:2] == (4, 2)  # the estimate annotation likewise
    plain = Policy(cluster_cache(), NO_MEMO)
    assert patches[2] == plain.judge(_with_env(job, "RUN_ID", "2"), NS, "mutate")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(_JOBS))),
    st.sampled_from(["mutate", "validate", "warn"]),
    st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=4),
)
def test_known_configs_under_new_names_are_answered_like_new_ones(
    i: int, mode: Any, run_ids: list[str]
) -> None:
    """Every fixture kind: a remembering policy answers each fresh copy exactly like a policy
    that remembers nothing (the judged-config and verdict memos never leak one job into
    another)."""
    cache = cluster_cache()
    plain, remembering = Policy(cache, NO_MEMO), Policy(cache)
    for n, run_id in enumerate(run_ids):
        variant = copy.deepcopy(_JOBS[i])
        variant.setdefault("metadata", {})["name"] = f"job-{n}"
        for c in _all_containers(variant):
            c.setdefault("env", []).append({"name": "RUN_ID", "value": run_id})
        assert remembering.judge(variant, NS, mode) == plain.judge(variant, NS, mode)


def _all_containers(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [c for c in node.get("containers", []) if isinstance(c, dict)]
        return found + [c for k, v in node.items() if k != "containers" for c in _all_containers(v)]
    if isinstance(node, list):
        return [c for item in node for c in _all_containers(item)]
    return []


def test_memo_keys_are_exact_for_jobs_and_bounded_for_huge_ones() -> None:
    small, other = b"[1]" * 10, b"[2]" * 10
    assert memo_key("validate", small) == ("validate", small) != memo_key("validate", other)
    assert memo_key("validate", small) != memo_key("evaluate", small)
    huge = b"x" * (RAW_KEY_MAX + 1)
    key = memo_key("validate", huge)
    assert len(key) == 3 and len(key[1]) == 16 and key[2] == len(huge)
    assert key == memo_key("validate", bytes(huge)) != memo_key("validate", huge[:-1] + b"y")
