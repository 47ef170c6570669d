"""What answering leaves behind is freed by ``Adapter.tidy``, never held without bound.

The server frees parsed requests and evicted memo entries after the answer is written
(dssup/admission/evaluate.py ``Leftovers``); these tests pin what is kept, for how long and up
to what bound. (That the real server tidies after each answer: test_admission_tls.py.)
"""

import json

from admission_helpers import cluster_cache, load, review

from dssup.admission import Adapter, Policy
from dssup.admission.adapter import KEEP_BODY_MAX
from dssup.admission.evaluate import LRU, Leftovers
from dssup.admission.settings import PolicySettings


def _body(obj: dict, run: int) -> bytes:
    job = json.loads(json.dumps(obj))
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c.setdefault("env", []).append({"name": "RUN_ID", "value": str(run)})
    return json.dumps(review(job)).encode()


def test_an_answer_leaves_its_request_until_tidy() -> None:
    adapter = Adapter(Policy(cluster_cache()))
    status, _ = adapter.handle("validate", _body(load("pytorchjob-dsv3-fits.yaml"), 1))
    assert status == 200 and len(adapter.policy.leftovers) == 1
    adapter.tidy()
    assert len(adapter.policy.leftovers) == 0


def test_a_large_request_is_freed_at_once() -> None:
    adapter = Adapter(Policy(cluster_cache()))
    job = load("pytorchjob-dsv3-fits.yaml")
    job["metadata"]["annotations"]["example.com/padding"] = "x" * KEEP_BODY_MAX
    body = json.dumps(review(job)).encode()
    assert len(body) > KEEP_BODY_MAX
    assert adapter.handle("validate", body)[0] == 200
    assert len(adapter.policy.leftovers) == 0


def test_evicted_entries_wait_for_release_and_the_wait_is_bounded() -> None:
    leftovers = Leftovers(limit=3)
    lru = LRU(2, leftovers)
    for i in range(4):
        lru.put(i, f"value-{i}")
    assert len(leftovers) == 2 and lru.get(0) is None and lru.get(3) == "value-3"
    for i in range(4, 10):
        lru.put(i, f"value-{i}")
    assert len(leftovers) == 3  # past the limit, evicted entries are freed at once
    leftovers.release()
    assert len(leftovers) == 0 and lru.stats()[2] == 2


def test_a_caller_that_never_tidies_holds_at_most_the_limit() -> None:
    policy = Policy(cluster_cache(), PolicySettings(judgement_cache_size=4))
    adapter = Adapter(policy)
    job = load("pytorchjob-dsv3-fits.yaml")
    for run in range(policy.leftovers.limit + 50):
        assert adapter.handle("mutate", _body(job, run))[0] == 200
    assert len(policy.leftovers) == policy.leftovers.limit
