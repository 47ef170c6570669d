"""``dssup run`` / ``dssup status`` flags, initial plan and exit codes (no torchrun launched)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from dssup.cli import main
from dssup.cli.run import _run_dir, initial_plan
from dssup.errors import ConfigError
from dssup.supervisor import parse_command


def test_help_documents_exit_codes():
    out = CliRunner().invoke(main, ["run", "--help"]).output
    for code in ("0 the job finished", "128+N", "125", "126", "127", "2 bad usage"):
        assert code in out


def test_ambiguous_worker_argument_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--run-dir",
            str(tmp_path / "r"),
            "--",
            "torchrun",
            "--standalone",
            "t.py",
            "--mon",
            "3",
        ],
    )
    assert res.exit_code == 2 and "ambiguous prefix" in res.output


def test_missing_launcher_is_127(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--quiet",
            "--run-dir",
            str(tmp_path / "r"),
            "--",
            "python3.99",
            "-m",
            "torch.distributed.run",
            "t.py",
        ],
    )
    assert res.exit_code == 127 and "command not found" in res.output


def test_run_ids_differ_for_same_named_dirs(tmp_path):
    a, _ = _run_dir([], {"run_dir": tmp_path / "x" / "run"})
    b, _ = _run_dir([], {"run_dir": tmp_path / "y" / "run"})
    assert a != b and a.startswith("run-") and b.startswith("run-")


def test_default_run_dir_is_per_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = _run_dir(["torchrun", "a.py"], {})
    assert a == _run_dir(["torchrun", "a.py"], {})
    assert a != _run_dir(["torchrun", "b.py"], {})
    assert a[1].parent == Path("dssup-runs")


@pytest.mark.parametrize(
    ("opts", "args", "want"),
    [
        ({"global_batch_size": 32, "micro_batch_size": 16}, [], (32, 16, 1)),
        ({"global_batch_size": 32}, ["--micro-batch-size", "4"], (32, 4, 4)),
        (
            {},
            ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"],
            (32, 8, 2),
        ),
        ({}, [], (None, None, None)),
    ],
)
def test_initial_plan(opts, args, want):
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", "t.py", *args], env={})
    p = initial_plan(cmd, {"tp": 1, "pp": 1, "cp": 1, **opts}, [])
    assert (p.global_batch, p.micro_batch, p.grad_accum) == want
    assert p.dp == 2 and p.world_size == 2


def test_indivisible_global_batch_is_refused():
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", "t.py"], env={})
    with pytest.raises(ConfigError, match="not a multiple"):
        initial_plan(
            cmd, {"tp": 1, "pp": 1, "cp": 1, "global_batch_size": 30, "micro_batch_size": 4}, []
        )


def test_status_of_a_missing_run_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert res.exit_code == 2 and "no journal" in res.output


def test_model_flag_puts_the_memory_model_on_the_ladder(tmp_path):
    from dssup.cli.run import build_supervisor
    from dssup.supervisor.adapters import BUILTIN_CAPABILITIES, RemedyContext
    from dssup.supervisor.modelplan import ModelStep
    from dssup.supervisor.models import Failure, FailureKind

    o = {
        "run_dir": tmp_path / "r",
        "model": "llama-3-8b",
        "gpu_memory": "80GiB",
        "global_batch_size": 256,
        "zero_stage": 1,
        "micro_batch_size": 4,
        "seq_len": 4096,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "ep": 1,
        "margin": 0.05,
        "device": "cuda",
        "quiet": True,
    }
    sup = build_supervisor(["torchrun", "--nproc-per-node", "8", "t.py"], o)
    assert any(isinstance(s, ModelStep) for s in sup.planner.steps)
    plan = sup.config.initial_plan
    assert (plan.micro_batch, plan.grad_accum, plan.dp) == (4, 8, 8)
    oom = Failure(kind=FailureKind.CUDA_OOM, tried_to_allocate=4 << 30, in_use_bytes=79 << 30)
    remedy = sup.planner.decide(
        oom, plan, RemedyContext(frozenset({plan.key()}), BUILTIN_CAPABILITIES, "cuda")
    )
    assert remedy.step == "memory-model" and remedy.plan.global_batch == 256


def test_model_without_gpu_memory_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "run",
            "--run-dir",
            str(tmp_path / "r"),
            "--model",
            "llama-3-8b",
            "--",
            "torchrun",
            "t.py",
        ],
    )
    assert res.exit_code == 2 and "--gpu-memory" in res.output


def test_the_deepspeed_adapter_joins_only_deepspeed_jobs(tmp_path):
    import json

    from dssup.cli.run import build_supervisor

    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "train_batch_size": 32,
                "train_micro_batch_size_per_gpu": 16,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 0},
            }
        )
    )
    same = {
        "run_dir": tmp_path / "a",
        "global_batch_size": 32,
        "micro_batch_size": 16,
        "quiet": True,
    }
    with_ds = build_supervisor(
        ["torchrun", "--nproc-per-node", "2", "t.py", "--deepspeed_config", str(ds)], same
    )
    plain = build_supervisor(
        ["torchrun", "--nproc-per-node", "2", "t.py"], {**same, "run_dir": tmp_path / "b"}
    )
    assert [a.name for a in with_ds.adapters] == ["deepspeed"]
    assert plain.adapters == []


def test_resume_takes_command_and_run_id_from_the_journal(tmp_path):
    from dssup.cli.run import build_supervisor
    from dssup.supervisor import Journal

    run = tmp_path / "r"
    j = Journal(run)
    j.append(
        "run-started",
        run_id="r-1234abcd",
        command=["torchrun", "--nproc-per-node", "2", "t.py", "--micro-batch-size", "4"],
        plan={},
        config={},
    )
    sup = build_supervisor([], {"resume": run, "quiet": True})
    assert sup.config.run_id == "r-1234abcd"
    assert sup.command.script_args == ["--micro-batch-size", "4"]
    with pytest.raises(ConfigError, match="another command"):
        build_supervisor(["torchrun", "other.py"], {"resume": run, "quiet": True})
