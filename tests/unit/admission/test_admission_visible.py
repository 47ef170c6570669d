"""No answer claims a fit through a change the pods cannot observe (issue 15, item 1).

Every resize path is exercised on a Llama-2-7B job that does not fit 8 x H200 at micro-batch
16: Megatron flags (``--flag value``, ``--flag=value``, inside ``bash -c``), HF flags (a
TrainJob override), a literal env var, the ``DSSUP_*`` contract env added to a ``dssup run``
container, inline DeepSpeed JSON and a downward-API template annotation. For each, the patched
pod template's containers (args, env, inline JSON) or its downward-exposed annotation carry the
new values, and so does the config re-read with every job-level knob annotation removed (what
the pods see). Job-level annotations alone (the pods never see them) and a DeepSpeed ConfigMap
are not patched: the answer names each setting and the value that would fit.
"""

import copy
import json

import jsonpatch
import pytest
from admission_helpers import cluster_cache

from dssup.admission import Policy
from dssup.admission.config import resolve
from dssup.admission.kinds import normalise
from dssup.admission.source import read_sources

CACHE = cluster_cache()
KNOBS = (
    "dssup.io/micro-batch-size",
    "dssup.io/global-batch-size",
    "dssup.io/recompute",
    "dssup.io/zero-stage",
)


def _job(container: dict, annotations: dict | None = None, template_meta: dict | None = None):
    container = {
        "name": "train",
        "image": "x",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
        **container,
    }
    template = {
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
            "restartPolicy": "Never",
            "containers": [container],
        }
    }
    if template_meta is not None:
        template["metadata"] = template_meta
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "vis",
            "namespace": "team-a",
            "annotations": {"dssup.io/model": "llama-2-7b", **(annotations or {})},
        },
        "spec": {"parallelism": 1, "completions": 1, "template": template},
    }


MEGATRON = [
    "--micro-batch-size",
    "16",
    "--global-batch-size",
    "128",
    "--seq-length",
    "4096",
    "--use-distributed-optimizer",
]
PATHS = {
    "megatron-sep": _job({"command": ["torchrun", "pretrain_gpt.py"], "args": MEGATRON}),
    "megatron-eq": _job(
        {
            "command": ["torchrun", "pretrain_gpt.py"],
            "args": [
                "--micro-batch-size=16",
                "--global-batch-size=128",
                "--seq-length=4096",
                "--use-distributed-optimizer",
            ],
        }
    ),
    "bash-script": _job(
        {
            "command": ["bash", "-c"],
            "args": ["cd /w && torchrun pretrain_gpt.py " + " ".join(MEGATRON)],
        }
    ),
    # FSDP script: the ZeRO-3-like sharding is stated on the job's word (an annotation)
    "hf-flags": _job(
        {
            "command": ["torchrun", "sft.py"],
            "args": [
                "--per_device_train_batch_size",
                "16",
                "--gradient_accumulation_steps",
                "1",
                "--max_seq_length",
                "4096",
            ],
        },
        {"dssup.io/zero-stage": "3"},
    ),
    "literal-env": _job(
        {
            "command": ["python", "train.py"],
            "env": [
                {"name": "DSSUP_MICRO_BATCH_SIZE", "value": "16"},
                {"name": "DSSUP_GLOBAL_BATCH_SIZE", "value": "128"},
                {"name": "DSSUP_SEQ_LENGTH", "value": "4096"},
                {"name": "DSSUP_RECOMPUTE", "value": "none"},
                {"name": "DSSUP_ZERO_STAGE", "value": "1"},
            ],
        }
    ),
    "contract-env": _job(
        {"command": ["dssup", "run", "--", "torchrun", "train.py"]},
        {
            "dssup.io/micro-batch-size": "16",
            "dssup.io/global-batch-size": "128",
            "dssup.io/seq-length": "4096",
            "dssup.io/recompute": "none",
            "dssup.io/zero-stage": "1",
        },
    ),
    "inline-deepspeed": _job(
        {
            "command": ["deepspeed", "train.py"],
            "args": [
                "--deepspeed",
                json.dumps(
                    {
                        "train_micro_batch_size_per_gpu": 16,
                        "gradient_accumulation_steps": 1,
                        "zero_optimization": {"stage": 1},
                    }
                ),
                "--max_seq_length",
                "4096",
            ],
        }
    ),
    "downward-annotation": _job(
        {
            "command": ["python", "train.py"],
            "env": [
                {
                    "name": "DSSUP_MICRO_BATCH_SIZE",
                    "valueFrom": {
                        "fieldRef": {
                            "fieldPath": "metadata.annotations['dssup.io/micro-batch-size']"
                        }
                    },
                },
                {"name": "DSSUP_GLOBAL_BATCH_SIZE", "value": "128"},
                {"name": "DSSUP_SEQ_LENGTH", "value": "4096"},
                {"name": "DSSUP_RECOMPUTE", "value": "none"},
                {"name": "DSSUP_ZERO_STAGE", "value": "1"},
            ],
        },
        template_meta={"annotations": {"dssup.io/micro-batch-size": "16"}},
    ),
}


def _pods_config(obj):
    """The config as the pods see it: job-level knob annotations removed."""
    seen = copy.deepcopy(obj)
    for key in KNOBS:
        seen["metadata"]["annotations"].pop(key, None)
    view = normalise(seen, CACHE, "team-a")
    return resolve(read_sources(view, CACHE), CACHE, view.world_size)


def _container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def policy():
    return Policy(CACHE)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_resize_path_changes_what_the_pods_see(policy, path):
    obj = PATHS[path]
    m = policy.judge(obj, "team-a", "mutate")
    assert m.code == "resized", (path, m.message)
    patched = jsonpatch.apply_patch(obj, list(m.patch))
    after = json.loads(patched["metadata"]["annotations"]["dssup.io/resized-to"])
    before = json.loads(patched["metadata"]["annotations"]["dssup.io/resized-from"])
    assert before != after
    seen = _pods_config(patched)
    names = {
        "microBatch": "micro_batch",
        "gradAccum": "grad_accum",
        "recompute": "recompute",
        "zeroStage": "zero_stage",
    }
    for key, knob in names.items():
        if before[key] != after[key] or key == "gradAccum":
            assert getattr(seen.training, knob) == after[key], (path, key)
    assert seen.global_batch == 128  # unchanged (16 x 8 GPUs), as the pods see it
    c, mb = _container(patched), str(after["microBatch"])
    env = {e["name"]: e for e in c.get("env", [])}
    if after["microBatch"] == before["microBatch"]:  # recompute or ZeRO changed instead
        assert path == "hf-flags" and "--gradient_checkpointing" in c["args"]
    elif path.startswith("megatron") or path == "bash-script":
        assert (
            f"--micro-batch-size {mb}" in " ".join(c["args"])
            or f"--micro-batch-size={mb}" in c["args"]
        )
    elif path == "hf-flags":
        assert c["args"][c["args"].index("--per_device_train_batch_size") + 1] == mb
    elif path in ("literal-env", "contract-env"):
        assert env["DSSUP_MICRO_BATCH_SIZE"]["value"] == mb
    elif path == "inline-deepspeed":
        ds = json.loads(c["args"][c["args"].index("--deepspeed") + 1])
        assert ds["train_micro_batch_size_per_gpu"] == after["microBatch"]
    else:  # downward API: the template annotation the env var reads
        assert (
            patched["spec"]["template"]["metadata"]["annotations"]["dssup.io/micro-batch-size"]
            == mb
        )
    estimate = json.loads(patched["metadata"]["annotations"]["dssup.io/estimate"])
    assert estimate["fits"] and estimate["config"]["microBatch"] == after["microBatch"]
    # what stays on the job's word: the FSDP script's sharding; the dssup-run job's knobs the
    # resize did not write into its env (sequence length, and ZeRO when unchanged)
    assumed = {"hf-flags": ["zeroStage"]}.get(path, [])
    if path == "contract-env":
        assumed = ["seqLength", "recompute", "zeroStage"]
        assumed = [k for k in assumed if before.get(k) == after.get(k) or k == "seqLength"]
    assert estimate.get("assumedFromJobAnnotations", []) == assumed
    again = policy.judge(patched, "team-a", "mutate")
    assert again.patch == () and policy.judge(patched, "team-a", "validate").allowed


def test_job_annotations_alone_are_never_a_resize(policy):
    obj = _job(
        {"command": ["python", "train.py"]},
        {
            "dssup.io/micro-batch-size": "16",
            "dssup.io/global-batch-size": "128",
            "dssup.io/seq-length": "4096",
            "dssup.io/recompute": "none",
            "dssup.io/zero-stage": "1",
        },
    )
    m = policy.judge(obj, "team-a", "mutate")
    assert m.code == "predicted-oom" and not m.patch
    v = policy.judge(obj, "team-a", "validate")
    assert not v.allowed
    assert "dssup.io/micro-batch-size=" in v.message and "pods do not see" in v.message
    w = policy.judge(obj, "team-a", "warn")
    assert w.allowed and "predicted OOM" in w.warnings[0]


def test_a_job_that_fits_only_under_assumed_defaults_is_not_denied(policy):
    """Missing input is never a denial: a script dssup knows nothing about, whose sequence
    length, recompute and ZeRO stage are dssup's guesses, is allowed with a warning naming them."""
    obj = _job({"command": ["python", "train.py"]}, {"dssup.io/micro-batch-size": "16"})
    for mode in ("mutate", "validate", "warn"):
        d = policy.judge(obj, "team-a", mode)
        assert d.allowed and d.code == "config-incomplete" and not d.patch
        assert "assumed sequence length 4096, recompute none, ZeRO-0" in d.warnings[0]


def test_deepspeed_configmap_knobs_are_named_not_patched(policy):
    obj = _job(
        {
            "command": ["deepspeed", "train.py"],
            "args": [
                "--deepspeed",
                "/cfg/ds_config.json",
                "--max_seq_length",
                "65536",
                "--gradient_checkpointing",
            ],
            "volumeMounts": [{"name": "ds", "mountPath": "/cfg"}],
        }
    )
    obj["spec"]["template"]["spec"]["volumes"] = [
        {"name": "ds", "configMap": {"name": "ds-config"}}
    ]
    m = policy.judge(obj, "team-a", "mutate")
    assert not m.patch and m.code in ("predicted-oom", "no-feasible-plan"), m.message
    v = policy.judge(obj, "team-a", "validate")
    assert not v.allowed and v.code == "predicted-oom"
    assert "DeepSpeed train_micro_batch_size_per_gpu=" in v.message
