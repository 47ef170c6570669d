"""Invariants of the webhook over generated jobs (hypothesis) and a 10,000-review fuzz run.

Properties: the mutating patch always applies to the object it was computed for; mutating the
result again yields an empty patch (idempotent, safe under reinvocationPolicy IfNeeded);
validate(mutate(x)) allows whenever mutate claimed a fit; the global batch is unchanged; the
validating answer never carries a patch. The fuzz run feeds the AdmissionReview adapter broken
and odd reviews: never a 5xx or an exception, always the same uid back.
"""

import base64
import copy
import json
import random

import jsonpatch
from admission_helpers import GROUPS, cluster_cache, job_files, load, review, schema_errors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dssup.admission import Adapter, Policy
from dssup.admission.applypatch import PatchError, apply_ops
from dssup.admission.config import resolve
from dssup.admission.kinds import normalise
from dssup.admission.settings import PolicySettings
from dssup.admission.source import read_sources

CACHE = cluster_cache()
POLICY = Policy(CACHE)
PRODUCTS = ["NVIDIA-H800", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"]
MODELS = ["llama-3-8b", "qwen2-7b", "llama-2-7b"]


@st.composite
def jobs(draw):
    kind = draw(st.sampled_from(["PyTorchJob", "Job", "Pod", "JobSet", "TrainJob"]))
    style = draw(st.sampled_from(["megatron", "megatron-eq", "script", "hf", "annotations"]))
    tp = draw(st.sampled_from([1, 2]))
    pods = 1 if kind in {"Pod"} else draw(st.integers(1, 3))
    gpus = 8
    dp = pods * gpus // tp
    mbs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    accum = draw(st.sampled_from([1, 2, 4]))
    gbs = mbs * accum * dp
    state_gbs = draw(st.booleans())
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    dist_opt = draw(st.booleans())
    seq = draw(st.sampled_from([2048, 4096]))
    ann = {"dssup.io/model": draw(st.sampled_from(MODELS))}
    if style.startswith("megatron") or style == "script":
        flags = [
            ("--tensor-model-parallel-size", tp),
            ("--micro-batch-size", mbs),
            ("--seq-length", seq),
        ]
        if state_gbs:
            flags.append(("--global-batch-size", gbs))
        if recompute != "none":
            flags.append(("--recompute-granularity", recompute))
        args = (
            [f"{k}={v}" for k, v in flags]
            if style == "megatron-eq"
            else [str(x) for kv in flags for x in kv]
        )
        if dist_opt:
            args.append("--use-distributed-optimizer")
        if style == "script":
            args = [" ".join(["torchrun", "train.py", *args])]
        command = ["bash", "-c"] if style == "script" else ["torchrun", "pretrain_gpt.py"]
    elif style == "hf":
        args = ["train.py", "--per_device_train_batch_size", str(mbs), "--max_seq_length", str(seq)]
        if accum > 1 or state_gbs:
            args += ["--gradient_accumulation_steps", str(accum)]
        if recompute == "full":
            args.append("--gradient_checkpointing")
        ann["dssup.io/layout"] = f"tp={tp}"
        command = ["torchrun"]
    else:
        # annotation-configured jobs run under ``dssup run``: they read the DSSUP_* contract env
        args, command = ["--", "python", "train.py"], ["dssup", "run"]
        ann.update(
            {
                "dssup.io/layout": f"tp={tp}",
                "dssup.io/micro-batch-size": str(mbs),
                "dssup.io/seq-length": str(seq),
                "dssup.io/recompute": recompute,
                "dssup.io/zero-stage": str(draw(st.integers(0, 3))),
            }
        )
        if state_gbs:
            ann["dssup.io/global-batch-size"] = str(gbs)
    product = draw(st.sampled_from(PRODUCTS))
    container = {
        "name": "node" if kind == "TrainJob" else "train",
        "image": "x",
        "command": command,
        "args": args,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    pod = {"nodeSelector": {"nvidia.com/gpu.product": product}, "containers": [container]}
    meta = {"name": "gen", "namespace": "team-a", "annotations": ann}
    if kind == "PyTorchJob":
        spec = {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": pod}},
                **(
                    {"Worker": {"replicas": pods - 1, "template": {"spec": copy.deepcopy(pod)}}}
                    if pods > 1
                    else {}
                ),
            }
        }
    elif kind == "Job":
        spec = {"parallelism": pods, "completions": pods, "template": {"spec": pod}}
    elif kind == "JobSet":
        spec = {
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": pods,
                    "template": {"spec": {"parallelism": 1, "template": {"spec": pod}}},
                }
            ]
        }
    elif kind == "TrainJob":  # runtime torch-distributed-h200 gives the node type (H200)
        spec = {
            "runtimeRef": {"name": "torch-distributed-h200"},
            "trainer": {"numNodes": pods, "command": command, "args": args},
        }
    else:
        spec = pod
    group, version, _ = GROUPS[kind]
    api = f"{group}/{version}" if group else version
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec}


def _global_batch(obj):
    view = normalise(obj, CACHE, "team-a")
    return resolve(read_sources(view, CACHE), CACHE, view.world_size).global_batch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_mutation_invariants(obj):
    original = copy.deepcopy(obj)
    m = POLICY.judge(obj, "team-a", "mutate")
    assert obj == original  # the policy never modifies its input
    assert m.allowed
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    assert apply_ops(copy.deepcopy(obj), list(m.patch)) == patched  # our verifier agrees
    assert schema_errors(patched) <= schema_errors(obj)  # the kind's real schema
    again = POLICY.judge(patched, "team-a", "mutate")
    assert again.patch == ()
    v = POLICY.judge(patched, "team-a", "validate")
    assert v.patch == ()
    if m.code in {"fits", "resized"}:
        assert v.allowed and v.code == "fits"
    if m.code == "resized":
        assert _global_batch(patched) == _global_batch(obj)


def _mutate(rng: random.Random, value, depth=0):
    """Replace, drop or retype random parts of a JSON value."""
    junk = [None, 0, -1, 1.5, "", "x" * 50, [], {}, True, "8", ["--micro-batch-size"], {"a": [1]}]
    if isinstance(value, dict) and value and depth < 12:
        out = dict(value)
        key = rng.choice(list(out))
        roll = rng.random()
        if roll < 0.2:
            out.pop(key)
        elif roll < 0.4:
            out[key] = rng.choice(junk)
        else:
            out[key] = _mutate(rng, out[key], depth + 1)
        return out
    if isinstance(value, list) and value and depth < 12:
        out = list(value)
        i = rng.randrange(len(out))
        out[i] = _mutate(rng, out[i], depth + 1) if rng.random() < 0.7 else rng.choice(junk)
        return out
    if isinstance(value, str) and value.isdigit():
        return str(rng.choice([0, 1, 2, 3, 64]))
    return rng.choice(junk) if rng.random() < 0.5 else value


PLAIN = Policy(CACHE, PolicySettings(judgement_cache_size=0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.sampled_from(["mutate", "validate", "warn"]), st.integers(0, 3))
def test_remembering_policy_answers_like_one_that_forgets(obj, mode, run_id):
    """POLICY keeps decisions, evaluations and resolved configs across all generated jobs (a
    run id env var makes some of them fresh jobs of a known template); PLAIN keeps none."""
    for c in (c for s in _pod_specs(obj) for c in s.get("containers", [])):
        c.setdefault("env", []).append({"name": "RUN_ID", "value": str(run_id)})
    assert POLICY.judge(obj, "team-a", mode) == PLAIN.judge(obj, "team-a", mode)


def _pod_specs(obj):
    spec = obj["spec"]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Job":
        return [spec["template"]["spec"]]
    if obj["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"]["spec"] for rj in spec["replicatedJobs"]]
    if obj["kind"] == "TrainJob":
        return []
    return [spec]


def test_fuzz_ten_thousand_reviews():
    rng = random.Random(20261129)
    adapter = Adapter(POLICY)
    bases = [json.dumps(review(load(name))) for name in job_files()]
    stats = {200: 0, 400: 0}
    for i in range(10_000):
        rev = json.loads(rng.choice(bases))
        rev["request"]["uid"] = f"fuzz-{i}"
        for _ in range(rng.randint(1, 4)):
            req = rev.get("request") if isinstance(rev, dict) else None
            if (
                rng.random() < 0.85
                and isinstance(req, dict)
                and isinstance(req.get("object"), dict)
            ):
                rev["request"]["object"] = _mutate(rng, rev["request"]["object"])
            else:
                rev = _mutate(rng, rev)
        body = json.dumps(rev).encode()
        if rng.random() < 0.03:
            body = body[: rng.randrange(len(body))]
        mode = rng.choice(["mutate", "validate", "warn"])
        status, out = adapter.handle(mode, body)
        assert status in stats, status
        stats[status] += 1
        doc = json.loads(out)
        if status == 400:
            assert "error" in doc
            continue
        resp = doc["response"]
        assert resp["uid"] == rev["request"]["uid"]
        assert not any("internal error" in w for w in resp.get("warnings", [])), rev
        assert isinstance(resp["allowed"], bool)
        assert resp.get("status", {}).get("code", 403) >= 400
        if "patch" in resp:
            assert mode == "mutate" and resp["allowed"] and resp["patchType"] == "JSONPatch"
            jsonpatch.apply_patch(
                rev["request"]["object"], json.loads(base64.b64decode(resp["patch"]))
            )
    assert stats[200] > 5000 and stats[400] > 100


def test_apply_ops_follows_rfc6902():
    doc = {"a": {"b~c/d": [1, 2]}, "l": ["x"]}
    ops = [
        {"op": "test", "path": "/a/b~0c~1d/1", "value": 2},
        {"op": "add", "path": "/l/-", "value": "y"},
        {"op": "add", "path": "/l/0", "value": "w"},
        {"op": "replace", "path": "/a/b~0c~1d/0", "value": 9},
        {"op": "remove", "path": "/l/1"},
        {"op": "add", "path": "/n", "value": {}},
    ]
    assert apply_ops(copy.deepcopy(doc), ops) == jsonpatch.apply_patch(doc, ops)
    for bad in (
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "test", "path": "/l/0", "value": "z"},
        {"op": "remove", "path": "/l/5"},
        {"op": "add", "path": "/l/01", "value": 1},
        {"op": "add", "path": "/x/y", "value": 1},
    ):
        try:
            apply_ops(copy.deepcopy(doc), [bad])
        except PatchError:
            pass
        else:
            raise AssertionError(bad)
