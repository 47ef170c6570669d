"""How real jobs name their kind, model and GPU (issue 15, items 2, 4 and 6).

Kinds by group/version/kind; MPIJob launch lines; TrainJob node selection from runtimePatches,
podSpecOverrides and podTemplateOverrides and its model initializer; Hub ids, torchtune configs
and Megatron tokenizers; GPUs from any node selector matched against cached Nodes, from cloud
instance types, MIG resources and AMD GPUs; duplicate flags and Unicode digits.
"""

import copy

import pytest
from admission_helpers import cluster_cache

from dssup.admission import InMemoryCache, Policy
from dssup.admission.config import resolve
from dssup.admission.kinds import identify, normalise
from dssup.admission.source import read_sources

CACHE = cluster_cache()
CONTAINER = {"name": "train", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}


def _job(api="batch/v1", kind="Job", pod_extra=None, container_extra=None, annotations=None):
    container = {**copy.deepcopy(CONTAINER), **(container_extra or {})}
    pod = {"containers": [container], **(pod_extra or {})}
    meta = {"name": "j", "namespace": "team-a", "annotations": annotations or {}}
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": {"template": {"spec": pod}}}


def _config(obj, cache=CACHE):
    view = normalise(obj, cache, "team-a")
    src = read_sources(view, cache)
    return resolve(src, cache, view.world_size), view


def test_kinds_are_matched_by_group_version_and_kind():
    assert identify(_job())[0].group == "batch"
    volcano = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job"}
    assert identify(volcano)[0].group == "batch.volcano.sh"
    reader, why = identify({"apiVersion": "kubeflow.org/v1", "kind": "MPIJob"})
    assert reader is None and "v1" in why and "v2beta1" in why
    assert identify({"apiVersion": "v1", "kind": 5})[1] == "kind 5 is not a kind name"
    decision = Policy(CACHE).judge({"apiVersion": "v1", "kind": 5}, "team-a", "validate")
    assert decision.allowed and decision.code == "unsupported-kind"


def test_volcano_job_tasks_count_their_replicas():
    obj = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "v", "namespace": "team-a"},
        "spec": {
            "tasks": [
                {"name": "w", "replicas": 4, "template": {"spec": {"containers": [CONTAINER]}}}
            ]
        },
    }
    assert normalise(obj, CACHE, "team-a").world_size == 32


def test_mpijob_reads_the_launchers_command_line():
    launcher = {
        "name": "l",
        "image": "x",
        "command": [
            "mpirun",
            "-np",
            "16",
            "python",
            "pretrain_gpt.py",
            "--micro-batch-size",
            "4",
            "--seq-length",
            "2048",
        ],
    }
    obj = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {
            "name": "m",
            "namespace": "team-a",
            "annotations": {"dssup.io/model": "llama-2-7b"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [launcher]}}},
                "Worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                            "containers": [CONTAINER],
                        }
                    },
                },
            }
        },
    }
    cfg, view = _config(obj)
    assert view.world_size == 16 and cfg.training.micro_batch == 4 and cfg.training.seq_len == 2048


def _trainjob(**spec):
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t", "namespace": "team-a"},
        "spec": {"runtimeRef": {"name": "torch-distributed-h200"}, **spec},
    }


@pytest.mark.parametrize(
    "spec",
    [
        {
            "runtimePatches": [
                {
                    "manager": "kueue.x-k8s.io/manager",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "spec": {
                                                        "nodeSelector": {
                                                            "cloud.google.com/gke-accelerator": "nvidia-l4"
                                                        }
                                                    }
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ]
        },
        {
            "podSpecOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                }
            ]
        },
        {
            "podTemplateOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "spec": {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
                }
            ]
        },
    ],
    ids=["runtimePatches-2.2", "podSpecOverrides-2.0", "podTemplateOverrides-2.1"],
)
def test_trainjob_node_selection_from_every_override_api(spec):
    """The runtime names no GPU (as Trainer's own runtimes do); the job's override selects it."""
    cache = cluster_cache()
    runtime = copy.deepcopy(
        cache.training_runtime("", "ClusterTrainingRuntime", "torch-distributed-h200")
    )
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    del node["spec"]["nodeSelector"]
    cache.upsert(runtime)
    assert normalise(_trainjob(), cache, "team-a").pod_sets[0].gpu_products == ()
    assert normalise(_trainjob(**spec), cache, "team-a").pod_sets[0].gpu_products == ("NVIDIA-L4",)


def test_trainjob_model_initializer_names_the_model():
    tj = _trainjob(
        initializer={"model": {"storageUri": "hf://meta-llama/Meta-Llama-3-8B"}},
        trainer={"numNodes": 1, "args": ["--max_seq_length", "2048"]},
    )
    cfg, _ = _config(tj)
    assert cfg.model.name == "meta-llama/Meta-Llama-3-8B"  # the model registry's config
    assert any("inferred from spec.initializer.model.storageUri" in w for w in cfg.warnings)


@pytest.mark.parametrize(
    ("extra", "model", "where"),
    [
        (
            {"args": ["train.py", "--model_name_or_path", "meta-llama/Meta-Llama-3-70B"]},
            "meta-llama/Meta-Llama-3-70B",
            "--model_name_or_path",
        ),
        (
            {"args": ["train.py", "--model=Qwen/Qwen2.5-7B-Instruct"]},
            "Qwen/Qwen2.5-7B-Instruct",
            "--model",
        ),
        (
            {"env": [{"name": "MODEL_ID", "value": "hf://deepseek-ai/DeepSeek-V2-Lite"}]},
            "deepseek-ai/DeepSeek-V2-Lite",
            "env MODEL_ID",
        ),
    ],
)
def test_hub_ids_name_known_models_with_a_warning(extra, model, where):
    obj = _job(
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}, container_extra=extra
    )
    cfg, _ = _config(obj)
    assert cfg.model.name == model
    assert any(w.startswith(f"model {model} inferred from {where}") for w in cfg.warnings)


def test_unknown_models_are_named_in_the_warning():
    obj = _job(
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        container_extra={"args": ["--model_name_or_path", "/models/mine"]},
    )
    d = Policy(CACHE).judge(obj, "team-a", "validate")
    assert (
        d.code == "config-incomplete"
        and "'/models/mine', a path dssup cannot read" in d.warnings[0]
    )


def test_megatron_tokenizer_types_give_the_vocabulary():
    args = [
        "pretrain_gpt.py",
        "--num-layers",
        "24",
        "--hidden-size",
        "2048",
        "--num-attention-heads",
        "16",
        "--seq-length",
        "2048",
        "--micro-batch-size",
        "1",
        "--tokenizer-type",
        "GPT2BPETokenizer",
    ]
    obj = _job(
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        container_extra={"args": args},
    )
    cfg, _ = _config(obj)
    assert cfg.model.vocab >= 50257
    assert "vocabulary 50257 inferred from --tokenizer-type GPT2BPETokenizer" in cfg.warnings


def test_a_flag_given_twice_reads_the_last_as_argparse_does():
    obj = _job(
        annotations={"dssup.io/model": "llama-2-7b"},
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        container_extra={
            "args": ["--micro-batch-size", "8", "--seq-length", "2048", "--micro-batch-size", "2"]
        },
    )
    cfg, _ = _config(obj)
    assert cfg.training.micro_batch == 2


def test_unicode_digits_are_not_numbers():
    obj = _job(
        annotations={"dssup.io/model": "llama-2-7b"},
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        container_extra={"args": ["--micro-batch-size", "²", "--seq-length", "2048"]},
    )
    for mode in ("mutate", "validate", "warn"):
        d = Policy(CACHE).judge(obj, "team-a", mode)
        assert d.code == "invalid-config" and "not a positive integer" in d.message
    obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "٨"
    d = Policy(CACHE).judge(obj, "team-a", "validate")
    assert d.allowed and d.code == "config-incomplete" and "'٨'" in d.warnings[0]


def test_gpu_from_any_node_label_matched_against_cached_nodes():
    cache = cluster_cache()
    cache.upsert(
        {
            "kind": "Node",
            "metadata": {
                "name": "pool-a-1",
                "labels": {
                    "nvidia.com/gpu.product": "NVIDIA-H200",
                    "nvidia.com/gpu.memory": "143771",
                    "team": "a",
                },
            },
        }
    )
    obj = _job(pod_extra={"nodeSelector": {"team": "a"}})
    assert normalise(obj, cache, "team-a").pod_sets[0].gpu_products == ("NVIDIA-H200",)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    assert normalise(_job(pod_extra={"affinity": affinity}), cache, "team-a").pod_sets[
        0
    ].gpu_products == ("NVIDIA-H200",)


@pytest.mark.parametrize(
    ("selector", "product"),
    [
        ({"node.kubernetes.io/instance-type": "p5.48xlarge"}, "NVIDIA-H100-80GB-HBM3"),
        ({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, "NVIDIA-A100-SXM4-40GB"),
        ({"node.kubernetes.io/instance-type": "p5en.48xlarge"}, "NVIDIA-H200"),
        ({"node.kubernetes.io/instance-type": "g6e.12xlarge"}, "NVIDIA-L40S"),
        ({"node.kubernetes.io/instance-type": "ml.g5.8xlarge"}, "NVIDIA-A10G"),
        ({"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}, "NVIDIA-H100-80GB-HBM3"),
        ({"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}, "NVIDIA-A100-SXM4-80GB"),
        ({"node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5"}, "NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_cloud_instance_types_without_a_cached_node(selector, product):
    view = normalise(_job(pod_extra={"nodeSelector": selector}), InMemoryCache(), "team-a")
    assert view.pod_sets[0].gpu_products == (product,)


def test_mig_and_amd_resources():
    mig = _job(
        container_extra={"resources": {"limits": {"nvidia.com/mig-3g.40gb": 2}}},
        annotations={"dssup.io/model": "llama-2-7b"},
    )
    view = normalise(mig, CACHE, "team-a")
    assert view.world_size == 2 and view.pod_sets[0].gpu_products == ("NVIDIA-MIG-3g.40gb",)
    d = Policy(CACHE).judge(mig, "team-a", "validate")
    # nothing but the model is stated: judged only if it fits under dssup's defaults
    assert d.code in {"fits", "config-incomplete"} and "MIG-3g.40gb" in d.message
    amd = _job(
        container_extra={"resources": {"limits": {"amd.com/gpu": 8}}},
        pod_extra={"nodeSelector": {"node.kubernetes.io/instance-type": "BM.GPU.MI300X.8"}},
        annotations={"dssup.io/model": "llama-2-7b"},
    )
    d = Policy(InMemoryCache()).judge(amd, "team-a", "validate")
    assert d.code in {"fits", "config-incomplete"}
    assert "AMD_Instinct_MI300X_OAM" in d.message  # the one GPU table's MI300X
    a100 = copy.deepcopy(mig)
    a100["spec"]["template"]["spec"]["nodeSelector"] = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"
    }
    products = normalise(a100, CACHE, "team-a").pod_sets[0].gpu_products
    assert products == ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",)


def test_every_instance_map_product_is_in_the_gpu_table():
    from dssup.admission.instances import INSTANCE_GPUS
    from dssup.memory.gpus import gpu_for_product

    missing = {p for p in INSTANCE_GPUS.values() if gpu_for_product(p) is None}
    assert not missing, missing


@pytest.mark.parametrize(
    "extra",
    [
        {"env": [{"name": "LORA_R", "value": "8"}]},
        {"args": ["train.py", "--use_peft", "--lora_r", "16"]},
        {"args": ["train.py", "--finetuning_type", "lora"]},
        {"command": ["tune", "run", "lora_finetune_distributed", "--config", "llama3_1/8B_lora"]},
    ],
    ids=["env", "trl-flags", "llama-factory", "torchtune"],
)
def test_lora_jobs_are_named_not_judged_as_full_training(extra):
    obj = _job(
        annotations={"dssup.io/model": "llama-2-7b", "dssup.io/seq-length": "512"},
        pod_extra={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
        container_extra=extra,
    )
    d = Policy(CACHE).judge(obj, "team-a", "validate")
    assert d.allowed and d.code == "config-incomplete"
    assert "LoRA/PEFT fine-tuning" in d.warnings[0]
