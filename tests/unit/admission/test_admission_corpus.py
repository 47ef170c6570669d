"""The webhook on a corpus of real public manifests (issue 15, acceptance 1).

tests/fixtures/admission/corpus/jobs holds GPU jobs fetched from the Kubeflow Trainer and
training-operator, Kueue, JobSet, Volcano, MPI operator, AWS (awsome-distributed-training,
aws-do-eks, ai-on-eks), GKE (kubernetes-engine-samples, ai-on-gke), OCI and NVIDIA repositories,
each with its source (repository, path, commit) in a header comment; corpus/runtimes the
Trainer's ClusterTrainingRuntimes (the watch cache's content); corpus/crds the openAPIV3Schema of
each CRD kind (see SOURCES.md). No Node is cached: GPUs come from the manifests' own selectors
and the built-in instance map, as in ``dssup admit`` before a cluster exists.

For every job: the model reference and GPU found are pinned (what real jobs state); the answer
is fits / resized / predicted-oom / no-feasible-plan when the model and the GPU are known, and
otherwise an allowed answer whose warning names what is missing; nothing crashes. A second pass
adds the one annotation those warnings ask for (``dssup.io/model``), so the real launch lines,
kinds and selectors are judged. Every patch applies, is schema-valid against the kind's CRD
(jsonschema; batch/v1 Job and v1 Pod with kubernetes-validate) and re-admission yields no patch.
"""

import copy
import json
import re
from collections import Counter

import jsonpatch
import pytest
import yaml
from admission_helpers import CORPUS, schema_errors

from dssup.admission import DENY_CODES, InMemoryCache, Policy
from dssup.admission.kinds import normalise
from dssup.admission.modelid import find_reference
from dssup.admission.source import read_sources

JUDGED = {"fits", "resized", "predicted-oom", "no-feasible-plan", "invalid-config"}
NOT_JUDGED = {"config-incomplete", "cache-miss", "unknown-gpu"}
# (model reference, GPU products, world size) found in each manifest.
IDENTIFIED = {
    "ai-on-eks-esm1nv-pretrain-job.yaml": (None, ("NVIDIA-A10G",), 8),
    "ai-on-eks-esm2nv-training-job.yaml": (None, ("NVIDIA-A10G",), 8),
    "ai-on-eks-executor-pod-template.yaml": (None, (), 0),
    "ai-on-eks-nvidia-smi-clusterautoscaler-test.yaml": (None, (), 1),
    "ai-on-eks-nvidia-smi-karpenter-test.yaml": (None, (), 1),
    "ai-on-gke-standard-tensorflow-bash.yaml": (None, ("Tesla-T4",), 1),
    "ai-on-gke-standard-tf-mnist-batch-predict.yaml": (None, ("Tesla-T4",), 1),
    "ai-on-gke-standard-tf-mnist-train.yaml": (None, ("Tesla-T4",), 1),
    "aws-do-eks-gpu-burn-pod.yaml": (None, (), 4),
    "aws-do-eks-imagenet-gpu.yaml": (None, (), 2),
    "aws-do-eks-pod-gpu.yaml": (None, (), 1),
    "aws-do-eks-profile.yaml": (None, (), 16),
    "aws-do-eks-vcjob.yaml": (None, (), 2),
    "awsome-distributed-training-1-imagenet-gpu-team-a.yaml": (None, ("NVIDIA-A10G",), 3),
    "awsome-distributed-training-3-imagenet-gpu-team-b-higher-prio.yaml": (
        None,
        ("NVIDIA-A10G",),
        2,
    ),
    "awsome-distributed-training-data-processing-pod-template.yaml": (None, (), 1),
    "awsome-distributed-training-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama2-13b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama2-70b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama2-7b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama3-1-70b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama3-1-8b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama3-2-1b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-llama3-2-3b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-mathstral-7b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-mistral-8x7b-fsdp.yaml": (None, (), 0),
    "awsome-distributed-training-nccl-tests-gb200.yaml": (None, (), 72),
    "awsome-distributed-training-nccl-tests.yaml": (None, ("NVIDIA-H100-80GB-HBM3",), 16),
    "jobset-readme-block0.yaml": (None, (), 15),
    "jobset-readme-block1.yaml": (None, (), 20),
    "jobset-readme-block3.yaml": ("meta-llama/Llama-3.2-1B-Instruct", (), 2),
    "k8s-device-plugin-job-1.yaml": (None, (), 1),
    "kubernetes-engine-samples-axolotl-training-job.yaml": (None, ("NVIDIA-A100-SXM4-40GB",), 1),
    "kubernetes-engine-samples-fine-tune-l4.yaml": ("google/gemma-2-2b", ("NVIDIA-L4",), 4),
    "kubernetes-engine-samples-finetune.yaml": ("google/gemma-2b", ("NVIDIA-L4",), 8),
    "kubernetes-engine-samples-job-patch.yaml": (None, (), 1),
    "kubernetes-engine-samples-job-team-a.yaml": (None, ("Tesla-T4",), 3),
    "kubernetes-engine-samples-job-team-b.yaml": (None, ("Tesla-T4",), 3),
    "kubernetes-engine-samples-job.yaml": ("$MODEL_ID", ("NVIDIA-H100-80GB-HBM3",), 1),
    "kueue-sample-job.yaml": (None, (), 3),
    "kueue-trainjob-block1.yaml": (None, (), 2),
    "kueue-trainjobs-block3.yaml": (None, (), 2),
    "mpi-operator-tensorflow-benchmarks.yaml": ("resnet101", (), 2),
    "oci-hpc-oke-bm.gpu.a100-v2.8.yaml": (None, ("NVIDIA-A100-SXM4-80GB",), 16),
    "oci-hpc-oke-bm.gpu.h100.8.yaml": (None, ("NVIDIA-H100-80GB-HBM3",), 16),
    "oci-hpc-oke-bm.gpu.h200.8.yaml": (None, ("NVIDIA-H200",), 16),
    "oci-hpc-oke-bm.gpu.mi300x.8.yaml": (None, ("AMD_Instinct_MI300X_OAM",), 16),
    "oci-hpc-oke-running-pytorch-jobs-on-oke-using-hostnetwork-with-rdma-block13.yaml": (
        None,
        (),
        2,
    ),
    "oci-hpc-oke-running-pytorch-jobs-on-oke-using-hostnetwork-with-rdma-block4.yaml": (
        None,
        (),
        2,
    ),
    "oci-hpc-oke-running-pytorch-jobs-on-oke-using-hostnetwork-with-rdma-block7.yaml": (
        None,
        (),
        2,
    ),
    "oci-hpc-oke-running-pytorch-jobs-on-oke-using-hostnetwork-with-rdma-block9.yaml": (
        None,
        (),
        2,
    ),
    "trainer-01-multi-node.yaml": (None, (), 0),
    "trainer-02-runtime-patches.yaml": (None, (), 0),
    "trainer-03-kueue-integration.yaml": (None, (), 0),
    "trainer-kai-block1.yaml": (None, (), 4),
    "trainer-lammps-train-gpus.yaml": (None, (), 2),
    "trainer-pytorch-deepspeed-demo.yaml": (None, (), 2),
    "trainer-pytorch-job-mnist-gloo.yaml": (None, (), 2),
    "trainer-pytorch-job-mnist-mpi.yaml": (None, (), 2),
    "trainer-pytorch-job-mnist-nccl.yaml": (None, (), 2),
    "volcano-elastic-scheduler-block0.yaml": (None, (), 10),
    "volcano-how-to-use-resource-strategy-fit-plugin-block4.yaml": (None, (), 1),
    "volcano-how-to-use-resource-strategy-fit-plugin-block7.yaml": (None, (), 1),
    "volcano-how-to-use-ssh-plugin-block0.yaml": (None, (), 2),
    "volcano-mindspore-gpu.yaml": (None, (), 2),
}


def _docs():
    out = []
    for path in sorted((CORPUS / "jobs").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


DOCS = _docs()


def _cache():
    cache = InMemoryCache()
    for path in sorted((CORPUS / "runtimes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                cache.upsert(doc)
    return cache


CACHE = _cache()
POLICY = Policy(CACHE)


def _answers(doc):
    return {mode: POLICY.judge(doc, "default", mode) for mode in ("mutate", "validate", "warn")}


def test_corpus_size_and_sources():
    kinds = Counter((doc["apiVersion"], doc["kind"]) for _, doc in DOCS)
    gpu_jobs = [name for name, _ in DOCS if IDENTIFIED[name][2] > 0 or "$" in yaml.safe_dump(_)]
    assert len(DOCS) >= 60 and len(gpu_jobs) >= 40, kinds
    for kind in ("PyTorchJob", "TrainJob", "JobSet", "Job", "MPIJob", "Pod"):
        assert any(k == kind for _, k in kinds), kind
    assert ("batch.volcano.sh/v1alpha1", "Job") in kinds
    for path in (CORPUS / "jobs").glob("*.yaml"):
        head = path.read_text().splitlines()[0]
        assert re.match(r"# Source: .*https://github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/", head), (
            path
        )
    assert sorted(IDENTIFIED) == sorted({name for name, _ in DOCS})


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_identification(name, doc):
    view = normalise(doc, CACHE, "default")
    src = read_sources(view, CACHE)

    def flag(names):
        hit = src.flag(names)
        return (hit.flag, hit.value) if hit is not None and hit.value else None

    ref = find_reference(flag, src.literal_env, view.model_refs)
    products = tuple(sorted({p for ps in view.pod_sets for p in ps.gpu_products}))
    assert ((ref.value if ref else None), products, view.world_size) == IDENTIFIED[name]


def _check_answers(name, doc, answers):
    for mode, d in answers.items():
        assert d.code != "internal-error", (name, mode, d.message)
        assert d.allowed or (mode == "validate" and d.code in DENY_CODES), (name, mode, d.code)
    v = answers["validate"]
    if v.code in NOT_JUDGED:
        assert v.warnings and v.warnings[0].startswith("dssup: not judged: "), (name, v.warnings)
        assert len(v.warnings[0]) > len("dssup: not judged: ") + 10
    m = answers["mutate"]
    if m.patch:
        patched = jsonpatch.apply_patch(doc, list(m.patch))
        assert schema_errors(patched) <= schema_errors(doc), (
            name,
            schema_errors(patched) - schema_errors(doc),
        )
        assert POLICY.judge(patched, "default", "mutate").patch == (), name
        if m.code in {"fits", "resized"}:
            assert POLICY.judge(patched, "default", "validate").allowed, name
    return v.code


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_real_manifest_answers(name, doc):
    code = _check_answers(name, doc, _answers(doc))
    _ref, _products, world = IDENTIFIED[name]
    if world == 0 and "$" not in json.dumps(doc) and "null" not in json.dumps(doc):
        assert code == "not-applicable", name
    else:
        assert code in JUDGED | NOT_JUDGED, (name, code)


ASKED = {  # what a not-judged warning asks for, as a user would state it
    "dssup.io/model": "llama-3-8b",
    "dssup.io/seq-length": "4096",
    "dssup.io/recompute": "full",
    "dssup.io/zero-stage": "1",
}


def _with_what_the_warnings_ask(doc):
    doc = copy.deepcopy(doc)
    doc.setdefault("metadata", {}).setdefault("annotations", {}).update(ASKED)
    return doc


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_real_manifest_with_the_model_named(name, doc):
    """The real manifest plus the annotations the warnings ask for (model, sequence length,
    recompute, ZeRO stage): judged whenever its GPU is known (else the warning names the GPU or
    the unreadable count)."""
    doc = _with_what_the_warnings_ask(doc)
    answers = _answers(doc)
    code = _check_answers(name, doc, answers)
    _, products, world = IDENTIFIED[name]
    known = bool(products)
    lora = "LoRA/PEFT" in answers["validate"].message  # adapters are not modelled: named
    if world > 0 and known and not lora:
        assert code in JUDGED, (name, code, answers["validate"].message)
    elif code in NOT_JUDGED:
        assert any(
            w in answers["validate"].warnings[0]
            for w in ("GPU", "not a number", "cache miss", "the model", "vocabulary", "LoRA")
        ), answers["validate"].warnings


def test_outcome_counts(capsys):
    """Counts by kind and outcome (printed for docs/admission.md)."""
    table = Counter()
    named = Counter()
    for _name, doc in DOCS:
        table[(doc["kind"], POLICY.judge(doc, "default", "validate").code)] += 1
        d2 = _with_what_the_warnings_ask(doc)
        named[(doc["kind"], POLICY.judge(d2, "default", "validate").code)] += 1
    with capsys.disabled():
        print("\ncorpus outcomes (as fetched):", dict(sorted(table.items())))
        print("corpus outcomes (model named):", dict(sorted(named.items())))
    assert sum(table.values()) == len(DOCS)
