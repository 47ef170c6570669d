"""``dssup admit``: decisions, exit codes (0 allowed, 1 denied, 2 unusable input) and JSON."""

import json
from pathlib import Path

import yaml
from admission_helpers import FIXTURES, JOBS
from click.testing import CliRunner

from dssup.cli import main

CLUSTER = str(FIXTURES / "cluster.yaml")


def _admit(*args, stdin=None):
    return CliRunner().invoke(main, ["admit", *args], input=stdin)


def test_allowed_job_exits_0_and_prints_breakdown():
    r = _admit("-f", str(JOBS / "jobset-llama70b.yaml"), "--cluster", CLUSTER)
    assert r.exit_code == 0, r.output
    assert "ALLOWED (fits)" in r.output and "<- peak" in r.output and "NVIDIA-H200" in r.output


def test_resized_job_prints_a_yaml_diff():
    r = _admit("-f", str(JOBS / "pytorchjob-dsv3-resize.yaml"), "--cluster", CLUSTER)
    assert r.exit_code == 0
    assert "ALLOWED (resized)" in r.output
    assert "-            - '8'" in r.output and "+    dssup.io/resized-from:" in r.output


def test_denied_job_exits_1_with_json_contract():
    r = _admit("-f", str(JOBS / "job-deepspeed.yaml"), "--cluster", CLUSTER, "--output", "json")
    assert r.exit_code == 1
    doc = json.loads(r.output)
    assert set(doc) == {"allowed", "code", "message", "warnings", "patch", "namespaceMode", "notes"}
    assert doc["namespaceMode"] == "enforce (default: no Namespace given)"
    assert doc["allowed"] is False and doc["code"] == "no-feasible-plan" and doc["patch"] == []


def test_json_patch_is_rfc6902():
    r = _admit("-f", str(JOBS / "pytorchjob-dsv3-resize.yaml"), "--json")  # GPU table, no cluster
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["code"] == "resized"
    assert {op["op"] for op in doc["patch"]} <= {"test", "replace", "add", "remove"}


def test_no_mutate_denies():
    r = _admit("-f", str(JOBS / "pytorchjob-dsv3-resize.yaml"), "--no-mutate")
    assert r.exit_code == 1 and "DENIED (predicted-oom)" in r.output


def test_reserve_changes_the_usable_memory():
    r = _admit("-f", str(JOBS / "jobset-llama70b.yaml"), "--reserve", "90GiB", "--json")
    doc = json.loads(r.output)
    assert (
        doc["allowed"] is True and doc["code"] == "resized"
    )  # 140 - 90 GiB leaves 50 GiB < 57.6 GiB


def test_unusable_input_exits_2():
    assert _admit("-f", "-", stdin="kind: ConfigMap\nmetadata: {name: x}\n").exit_code == 2
    assert _admit("-f", "-", stdin="{{{").exit_code == 2
    assert _admit("-f", "/nonexistent.yaml").exit_code == 2
    assert _admit("-f", str(JOBS / "job-cpu.yaml"), "--plan-margin", "2").exit_code == 2


def test_several_jobs_give_a_json_list_and_the_worst_exit():
    text = (
        (JOBS / "job-cpu.yaml").read_text() + "\n---\n" + (JOBS / "job-deepspeed.yaml").read_text()
    )
    r = _admit("-f", "-", "--cluster", CLUSTER, "--json", stdin=text)
    docs = json.loads(r.output)
    assert r.exit_code == 1 and [d["allowed"] for d in docs] == [True, False]


def _cluster_without_ds_config(labelled: bool) -> str:
    docs = [d for d in yaml.safe_load_all(Path(CLUSTER).read_text()) if d]
    out = []
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ds-config":
            if labelled:
                continue
            d["metadata"]["labels"] = {}
        out.append(d)
    return yaml.safe_dump_all(out)


def test_missing_deepspeed_configmap_is_a_cache_miss_not_a_denial(tmp_path):
    """The ZeRO stage lives in a ConfigMap the webhook does not have: allowed, cache-miss (not
    judged as ZeRO-0 and denied)."""
    absent = tmp_path / "absent.yaml"
    absent.write_text(_cluster_without_ds_config(labelled=True))
    r = _admit("-f", str(JOBS / "job-deepspeed.yaml"), "--cluster", str(absent), "--json")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["code"] == "cache-miss" and doc["allowed"] is True
    assert "ds-config" in doc["warnings"][0]


def test_unwatched_configmap_is_not_used_and_said_so(tmp_path):
    unlabelled = tmp_path / "unlabelled.yaml"
    unlabelled.write_text(_cluster_without_ds_config(labelled=False))
    r = _admit("-f", str(JOBS / "job-deepspeed.yaml"), "--cluster", str(unlabelled), "--json")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["code"] == "cache-miss"
    assert any("team-a/ds-config" in n and "would not see it" in n for n in doc["notes"])


NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  labels: {%s}\n---\n"


def test_namespace_mode_from_the_namespace_or_the_flag():
    job = (JOBS / "pytorchjob-dsv3-resize.yaml").read_text()
    warn = _admit("-f", "-", "--json", stdin=NAMESPACE % "" + job)
    doc = json.loads(warn.output)
    assert warn.exit_code == 0 and doc["code"] == "predicted-oom" and not doc["patch"]
    assert doc["namespaceMode"].startswith("warn (Namespace team-a") and doc["warnings"]
    enforce = json.loads(
        _admit("-f", "-", "--json", stdin=NAMESPACE % "dssup.io/enforce: 'true'" + job).output
    )
    assert enforce["code"] == "resized" and enforce["namespaceMode"].startswith(
        "enforce (Namespace"
    )
    off = json.loads(
        _admit("-f", "-", "--json", stdin=NAMESPACE % "dssup.io/admission: 'off'" + job).output
    )
    assert off["code"] == "not-applicable" and off["namespaceMode"].startswith("off")
    flag = _admit(
        "-f",
        "-",
        "--json",
        "--namespace-mode",
        "enforce",
        "--no-mutate",
        stdin=NAMESPACE % "" + job,
    )
    assert (
        flag.exit_code == 1
        and json.loads(flag.output)["namespaceMode"] == "enforce (--namespace-mode)"
    )
    text = _admit("-f", str(JOBS / "pytorchjob-dsv3-resize.yaml"))
    assert "namespace mode: enforce (default: no Namespace given)" in text.output


def test_hostile_input_is_exit_2_or_an_answer(tmp_path):
    binary = tmp_path / "job.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    r = _admit("-f", str(binary))
    assert r.exit_code == 2 and "not UTF-8" in r.output and "Traceback" not in r.output
    r = _admit("-f", "-", stdin="apiVersion: v1\nkind: 5\nmetadata: {name: x}\n")
    assert r.exit_code == 2 and "kind is 5" in r.output
    job = (
        (JOBS / "pytorchjob-dsv3-fits.yaml")
        .read_text()
        .replace('--micro-batch-size, "2"', '--micro-batch-size, "²"')
    )
    assert "²" in job
    r = _admit("-f", "-", "--json", stdin=job)
    doc = json.loads(r.output)
    assert (r.exit_code == 0 and doc["code"] == "invalid-config") or doc["allowed"] is False
    assert "not a positive integer" in doc["message"]
    deep = "a: " + "[" * 5000 + "]" * 5000
    r = _admit("-f", "-", stdin=deep)
    assert r.exit_code == 2 and "Traceback" not in r.output
    volcano = "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: v}\nspec:\n  tasks:\n  - replicas: 2\n    template:\n      spec:\n        containers:\n        - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 8}}}\n"
    doc = json.loads(_admit("-f", "-", "--json", stdin=volcano).output)
    assert doc["code"] == "config-incomplete"  # read as Volcano (16 GPUs), not as batch/v1
