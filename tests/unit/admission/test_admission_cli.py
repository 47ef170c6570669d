"""``dssup admit``: decisions, exit codes (0 allowed, 1 denied, 2 unusable input) and JSON."""

import json

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
    assert set(doc) == {"allowed", "code", "message", "warnings", "patch"}
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
