"""The policy on real-shaped fixtures of every kind: allow, resize, deny, and the edge rules.

The cluster (Nodes with GFD labels, ConfigMaps, a ClusterTrainingRuntime) is an in-memory cache
fed from tests/fixtures/admission/cluster.yaml: no kube-apiserver exists here.
"""

import copy
import json

import jsonpatch
import pytest
from admission_helpers import cluster_cache, job_files, load, review

from dssup.admission import DENY_CODES, InMemoryCache, Policy, PolicySettings, parse_review
from dssup.admission.kinds import normalise
from dssup.admission.view import escape

EXPECTED = {  # fixture -> (validate code, mutate code, world size)
    "pytorchjob-dsv3-fits.yaml": ("fits", "fits", 2048),
    "pytorchjob-dsv3-resize.yaml": ("predicted-oom", "resized", 2048),
    "trainjob-qwen2-hf.yaml": ("predicted-oom", "resized", 16),
    "jobset-llama70b.yaml": ("fits", "fits", 64),
    "job-annotations.yaml": ("predicted-oom", "predicted-oom", 16),
    "pod-shell.yaml": ("predicted-oom", "resized", 8),
    "job-deepspeed.yaml": ("no-feasible-plan", "no-feasible-plan", 4),
    "job-cpu.yaml": ("not-applicable", "not-applicable", 0),
    "pytorchjob-zero-infinity.yaml": ("predicted-host-oom", "predicted-host-oom", 16),
}


@pytest.fixture(scope="module")
def policy():
    return Policy(cluster_cache())


def test_every_fixture_has_an_expectation():
    assert sorted(EXPECTED) == job_files()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_normalised_world_size(name):
    assert normalise(load(name), cluster_cache()).world_size == EXPECTED[name][2]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_validate_and_mutate_codes(policy, name):
    obj = load(name)
    v = policy.judge(obj, "team-a", "validate")
    m = policy.judge(obj, "team-a", "mutate")
    assert (v.code, m.code) == EXPECTED[name][:2]
    assert v.allowed == (v.code not in DENY_CODES)
    assert m.allowed and not v.patch
    w = policy.judge(obj, "team-a", "warn")
    assert w.allowed and w.code == v.code and not w.patch
    if v.code in DENY_CODES:
        assert w.warnings and len(w.warnings[0]) <= 240


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_mutation_applies_is_idempotent_and_validates(policy, name):
    obj = load(name)
    m = policy.judge(obj, "team-a", "mutate")
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    again = policy.judge(patched, "team-a", "mutate")
    assert again.patch == (), again.patch
    if m.code in {"fits", "resized"}:
        assert policy.judge(patched, "team-a", "validate").allowed


def test_resize_keeps_global_batch_and_records_old_and_new(policy):
    obj = load("pytorchjob-dsv3-resize.yaml")
    m = policy.judge(obj, "team-a", "mutate")
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    ann = patched["metadata"]["annotations"]
    before, after = json.loads(ann["dssup.io/resized-from"]), json.loads(ann["dssup.io/resized-to"])
    dp = 2048 // 16
    assert before["microBatch"] * before["gradAccum"] * dp == 2048
    assert after["microBatch"] * after["gradAccum"] * dp == 2048
    assert after["microBatch"] < before["microBatch"]
    for rtype in ("Master", "Worker"):
        args = patched["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0][
            "args"
        ]
        assert args[args.index("--micro-batch-size") + 1] == str(after["microBatch"])
        assert args[args.index("--global-batch-size") + 1] == "2048"
    assert json.loads(ann["dssup.io/estimate"])["fits"] is True


def test_resize_appends_global_batch_when_megatron_derives_it(policy):
    obj = load("pytorchjob-dsv3-resize.yaml")
    for rtype in ("Master", "Worker"):
        args = obj["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0][
            "args"
        ]
        i = args.index("--global-batch-size")
        del args[i : i + 2]
    # Without the flag Megatron uses mbs x dp = 8 x 128 = 1024; the resize must keep 1024.
    m = policy.judge(obj, "team-a", "mutate")
    assert m.code == "resized"
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    args = patched["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--global-batch-size") + 1] == "1024"


def test_shell_script_values_are_rewritten_in_place(policy):
    m = policy.judge(load("pod-shell.yaml"), "team-a", "mutate")
    script = jsonpatch.apply_patch(load("pod-shell.yaml"), list(m.patch))["spec"]["containers"][0][
        "args"
    ][0]
    assert "--micro-batch-size 16" not in script and "--global-batch-size 64" in script
    assert script.endswith("&& echo done")
    assert {op["op"] for op in m.patch} <= {"test", "replace", "add"}


def test_denial_message_is_actionable(policy):
    d = policy.judge(load("pytorchjob-dsv3-resize.yaml"), "team-a", "validate")
    for part in (
        "GiB/GPU",
        "pipeline stage",
        "NVIDIA-H800",
        "usable",
        "closest fitting config",
        "micro-batch",
        "activations",
    ):
        assert part in d.message


def test_resize_disabled_by_annotation(policy):
    obj = load("pytorchjob-dsv3-resize.yaml")
    obj["metadata"]["annotations"]["dssup.io/resize"] = "false"
    m = policy.judge(obj, "team-a", "mutate")
    assert m.code == "predicted-oom" and not m.patch


def test_estimate_annotation_is_added_when_there_are_no_annotations():
    obj = load("jobset-llama70b.yaml")
    del obj["metadata"]["annotations"]
    # The model then comes from nowhere: not judged, allowed, no patch.
    m = Policy(cluster_cache()).judge(obj, "team-a", "mutate")
    assert m.code == "config-incomplete" and m.allowed and not m.patch
    obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "args"
    ] += [
        "--num-layers",
        "80",
        "--hidden-size",
        "8192",
        "--ffn-hidden-size",
        "28672",
        "--num-attention-heads",
        "64",
        "--group-query-attention",
        "--num-query-groups",
        "8",
        "--vocab-size",
        "128256",
        "--untie-embeddings-and-output-weights",
    ]
    m = Policy(cluster_cache()).judge(obj, "team-a", "mutate")
    assert m.code == "fits"
    assert (
        m.patch[0]["path"] == "/metadata/annotations" and "dssup.io/estimate" in m.patch[0]["value"]
    )


def test_update_is_denied_only_when_it_breaks_a_fitting_job(policy):
    fits, big = load("pytorchjob-dsv3-fits.yaml"), load("pytorchjob-dsv3-resize.yaml")
    big["metadata"]["name"] = fits["metadata"]["name"]
    breaking = policy.review(parse_review(review(big, "UPDATE", old=fits)), "validate")
    assert not breaking.allowed and breaking.code == "predicted-oom"
    already = policy.review(parse_review(review(big, "UPDATE", old=copy.deepcopy(big))), "validate")
    assert already.allowed and any("did not fit before" in w for w in already.warnings)
    assert (
        policy.review(parse_review(review(fits, "UPDATE", old=fits)), "mutate").code
        == "not-applicable"
    )


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"operation": "DELETE"}, "not-applicable"),
        ({"operation": "CONNECT"}, "not-applicable"),
        ({"sub_resource": "status"}, "not-applicable"),
    ],
)
def test_operations_that_are_not_judged(policy, kwargs, code):
    obj = load("pytorchjob-dsv3-resize.yaml")
    op = kwargs.pop("operation", "CREATE")
    rev = review(None if op == "DELETE" else obj, op, old=obj if op == "DELETE" else None, **kwargs)
    for mode in ("mutate", "validate"):
        d = policy.review(parse_review(rev), mode)
        assert d.allowed and d.code == code and not d.patch


def test_dry_run_is_answered_like_a_real_request(policy):
    obj = load("pytorchjob-dsv3-resize.yaml")
    real = policy.review(parse_review(review(obj)), "mutate")
    dry = policy.review(parse_review(review(obj, dry_run=True)), "mutate")
    assert real == dry and real.code == "resized"


def test_generate_name_only(policy):
    obj = load("pytorchjob-dsv3-fits.yaml")
    obj["metadata"].pop("name")
    obj["metadata"]["generateName"] = "dsv3-"
    assert policy.review(parse_review(review(obj)), "validate").code == "fits"


def test_controlled_pod_and_unknown_kind_and_missing_object(policy):
    pod = load("pod-shell.yaml")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "1", "controller": True}
    ]
    assert policy.judge(pod, "team-a", "validate").code == "not-applicable"
    weird = {"apiVersion": "example.com/v1", "kind": "RayJob", "metadata": {"name": "r"}}
    d = policy.judge(weird, "team-a", "validate")
    assert d.allowed and d.code == "unsupported-kind" and d.warnings
    rev = review(load("job-cpu.yaml"))
    rev["request"]["object"] = "oops"
    assert policy.review(parse_review(rev), "validate").code == "malformed-object"


def test_cache_misses_allow_with_a_warning():
    cache = InMemoryCache()  # empty: no runtime, no ConfigMaps, no Nodes
    policy = Policy(cache)
    tj = policy.judge(load("trainjob-qwen2-hf.yaml"), "team-a", "validate")
    assert tj.allowed and tj.code == "cache-miss" and "ClusterTrainingRuntime" in tj.warnings[0]
    ds = policy.judge(load("job-deepspeed.yaml"), "team-a", "validate")
    assert ds.allowed


def test_unknown_gpu_allows_and_default_gpu_applies():
    obj = load("jobset-llama70b.yaml")
    pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    del pod["nodeSelector"]
    assert Policy(cluster_cache()).judge(obj, "team-a", "validate").code == "unknown-gpu"
    settings = PolicySettings(default_gpu_product="NVIDIA-H200")
    assert Policy(cluster_cache(), settings).judge(obj, "team-a", "validate").code == "fits"


def test_gpu_table_is_used_without_node_labels():
    d = Policy(InMemoryCache(), explain=True).judge(
        load("jobset-llama70b.yaml"), "team-a", "validate"
    )
    assert d.code == "fits" and d.breakdown["gpu"]["source"] == "table"


def test_invalid_config_is_denied_only_when_enforcing(policy):
    obj = load("jobset-llama70b.yaml")
    args = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    args[args.index("--tensor-model-parallel-size") + 1] = "3"  # 64 GPUs not a multiple of 3*4
    v = policy.judge(obj, "team-a", "validate")
    assert not v.allowed and v.code == "invalid-config" and "tp*pp*cp" in v.message
    assert policy.judge(obj, "team-a", "warn").allowed
    assert policy.judge(obj, "team-a", "mutate").allowed


def test_escape_json_pointer():
    assert escape("dssup.io/model") == "dssup.io~1model" and escape("a~b") == "a~0b"


def test_breakdown_only_when_explaining():
    obj = load("pytorchjob-dsv3-fits.yaml")
    assert Policy(cluster_cache()).judge(obj, "team-a", "validate").breakdown is None
    bd = Policy(cluster_cache(), explain=True).judge(obj, "team-a", "validate").breakdown
    assert (
        len(bd["stages"]) == 16
        and bd["config"]["pp"] == 16
        and bd["gpu"]["source"] == "node-labels"
    )


def _growable(workers=1, **annotations):
    args = [
        "--tensor-model-parallel-size",
        "8",
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        "64",
        "--seq-length",
        "4096",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--use-distributed-optimizer",
    ]

    def pod():
        return {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H800"},
            "containers": [
                {
                    "name": "pytorch",
                    "image": "x",
                    "args": list(args),
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "grow",
            "namespace": "team-a",
            "annotations": {"dssup.io/model": "llama-3-70b", **annotations},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": pod()}},
                "Worker": {"replicas": workers, "template": {"spec": pod()}},
            }
        },
    }


def test_more_replicas_only_when_the_job_allows_it(policy):
    # Llama-3-70B with TP=8 on 2 nodes of H800 fits no micro-batch/recompute/ZeRO-0/1 setting.
    fixed = policy.judge(_growable(), "team-a", "mutate")
    assert (
        fixed.code == "no-feasible-plan"
        and not fixed.patch
        and "dssup.io/max-gpus" in fixed.message
    )
    obj = _growable(**{"dssup.io/max-gpus": "128"})
    m = policy.judge(obj, "team-a", "mutate")
    assert m.code == "resized", m.message
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    workers = patched["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    assert 1 < workers <= 15
    ann = patched["metadata"]["annotations"]
    assert json.loads(ann["dssup.io/resized-from"])["gpus"] == 16
    assert json.loads(ann["dssup.io/resized-to"])["gpus"] == 8 * (workers + 1)
    args = patched["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--global-batch-size") + 1] == "64"
    assert policy.judge(patched, "team-a", "mutate").patch == ()
    assert policy.judge(patched, "team-a", "validate").code == "fits"


def test_elastic_policy_max_replicas_allows_growth_and_nnodes_forbids_it(policy):
    obj = _growable()
    obj["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 15}
    assert policy.judge(obj, "team-a", "mutate").code == "resized"
    for rtype in ("Master", "Worker"):
        c = obj["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0]
        c["command"] = ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "pretrain_gpt.py"]
    assert policy.judge(obj, "team-a", "mutate").code == "no-feasible-plan"


def test_cache_replace_all_and_delete():
    cache = cluster_cache()
    assert cache.gpu_product("NVIDIA-H800").nodes == 2
    assert cache.gpu_product("NVIDIA-L4-SHARED").replicas == 2
    cache.replace_all(
        "Node",
        [
            {
                "metadata": {
                    "name": "n",
                    "labels": {
                        "nvidia.com/gpu.product": "NVIDIA-H800",
                        "nvidia.com/gpu.memory": "80000",
                    },
                }
            }
        ],
    )
    info = cache.gpu_product("NVIDIA-H800")
    assert (info.nodes, info.memory_mib) == (1, 80000) and cache.gpu_product("NVIDIA-H200") is None
    cache.delete("Node", "", "n")
    assert cache.gpu_product("NVIDIA-H800") is None
    assert (
        cache.training_runtime("", "ClusterTrainingRuntime", "torch-distributed-h200") is not None
    )
    cache.replace_all("ClusterTrainingRuntime", [])
    assert cache.training_runtime("", "ClusterTrainingRuntime", "torch-distributed-h200") is None
    assert cache.config_map("team-a", "ds-config") is not None
    cache.delete("ConfigMap", "team-a", "ds-config")
    assert cache.config_map("team-a", "ds-config") is None


def test_missing_deepspeed_configmap_answers_cache_miss_through_the_webhook():
    """The server's path (AdmissionReview bytes in and out): a ZeRO job whose DeepSpeed
    ConfigMap is not in the watch cache is allowed with cache-miss on every webhook path."""
    from dssup.admission import Adapter

    cache = cluster_cache()
    cache.delete("ConfigMap", "team-a", "ds-config")
    adapter = Adapter(Policy(cache))
    for path in ("mutate", "validate", "warn"):
        status, body = adapter.handle(path, json.dumps(review(load("job-deepspeed.yaml"))).encode())
        resp = json.loads(body)["response"]
        assert status == 200 and resp["allowed"] is True and "patch" not in resp
        assert resp["warnings"][0].startswith("dssup: not judged: cache miss: ConfigMap ds-config")
    cache.upsert(
        next(d for d in cluster_docs_of("ConfigMap") if d["metadata"]["name"] == "ds-config")
    )
    status, body = adapter.handle(
        "validate", json.dumps(review(load("job-deepspeed.yaml"))).encode()
    )
    assert json.loads(body)["response"]["allowed"] is False  # judged once the ConfigMap arrives


def cluster_docs_of(kind):
    from admission_helpers import cluster_docs

    return [d for d in cluster_docs() if d["kind"] == kind]


def test_kueue_create_suspended_then_unsuspend_with_the_flavor_warns():
    """Kueue creates the job suspended without a GPU selector (judged: unknown GPU, allowed),
    then injects the ResourceFlavor's node selector and unsuspends it with an UPDATE: the job
    that does not fit gets a warning, never a late denial on Kueue's controller."""
    from dssup.admission import Adapter

    created = load("pytorchjob-dsv3-resize.yaml")
    created["spec"]["runPolicy"] = {"suspend": True}
    for r in created["spec"]["pytorchReplicaSpecs"].values():
        del r["template"]["spec"]["nodeSelector"]
    adapter = Adapter(Policy(cluster_cache()))

    def answer(path, obj, op="CREATE", old=None):
        body = json.dumps(review(obj, op, old=old)).encode()
        return json.loads(adapter.handle(path, body)[1])["response"]

    assert answer("validate", created)["allowed"] is True  # unknown GPU at CREATE
    admitted = copy.deepcopy(created)
    admitted["spec"]["runPolicy"]["suspend"] = False
    for r in admitted["spec"]["pytorchReplicaSpecs"].values():
        r["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H800"}
    resp = answer("validate", admitted, "UPDATE", created)
    assert resp["allowed"] is True
    assert "predicted" in resp["warnings"][0] and "unsuspended (Kueue)" in resp["warnings"][1]
    assert answer("validate", admitted, "CREATE")["allowed"] is False  # a plain CREATE is denied


def test_unknown_model_type_in_a_configmap_is_incomplete_not_denied():
    """A real config dssup cannot read exactly (Kimi-K2, model_type kimi_k2; source in
    tests/fixtures/models/README.md) is missing information: allowed with a warning."""
    from pathlib import Path

    text = (
        Path(__file__).parents[2] / "fixtures/models/moonshotai--Kimi-K2-Instruct.json"
    ).read_text()
    cache = cluster_cache()
    cache.upsert({"kind": "ConfigMap", "metadata": {"name": "kimi", "namespace": "team-a"},
                  "data": {"config.json": text}})  # fmt: skip
    obj = load("jobset-llama70b.yaml")
    obj["metadata"].setdefault("annotations", {})["dssup.io/model"] = "configmap:kimi/config.json"
    d = Policy(cache).judge(obj, "team-a", "validate")
    assert d.allowed and d.code == "config-incomplete", (d.code, d.message)
    assert "kimi_k2" in " ".join(d.warnings) + d.message
