"""The environment contract and the rewriting of known batch flags."""

from pathlib import Path

from dssup.supervisor.contract import contract_env, read_plan_flags, rewrite_flags
from dssup.supervisor.models import TrainingPlan

PLAN = TrainingPlan(micro_batch=4, grad_accum=8, global_batch=64, dp=2, world_size=2)


def test_megatron_and_hf_flags_are_rewritten_in_place():
    args = ["--micro-batch-size", "16", "--gradient-accumulation-steps=2", "--lr", "1"]
    assert rewrite_flags(args, PLAN) == [
        "--micro-batch-size",
        "4",
        "--gradient-accumulation-steps=8",
        "--lr",
        "1",
    ]
    hf = ["--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2"]
    assert rewrite_flags(hf, PLAN) == [
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "8",
    ]


def test_missing_flags_are_not_added_and_recompute_switches_hf_checkpointing():
    assert rewrite_flags(["--lr", "1"], PLAN) == ["--lr", "1"]
    full = PLAN.model_copy(update={"recompute": "full"})
    out = rewrite_flags(["--per_device_train_batch_size", "16"], full)
    assert out == ["--per_device_train_batch_size", "4", "--gradient_checkpointing"]
    assert rewrite_flags(["--gradient_checkpointing", "false"], full) == [
        "--gradient_checkpointing",
        "true",
    ]


def test_read_plan_flags():
    assert read_plan_flags(["--micro-batch-size", "16", "--global-batch-size=64", "--x", "3"]) == {
        "micro_batch": 16,
        "global_batch": 64,
    }


def test_contract_every_variable():
    env = contract_env(
        PLAN,
        attempt=3,
        run_id="r",
        run_dir=Path("/r"),
        attempt_dir=Path("/r/a"),
        token="r/3",
        resume_from=Path("/c/step_4"),
        checkpoint_dir=Path("/c"),
    )
    assert env["DSSUP_ATTEMPT"] == "3"
    assert env["DSSUP_MICRO_BATCH_SIZE"] == "4"
    assert env["DSSUP_GRAD_ACCUM_STEPS"] == "8"
    assert env["DSSUP_GLOBAL_BATCH_SIZE"] == "64"
    assert env["DSSUP_RESUME_FROM"] == "/c/step_4"
    assert env["DSSUP_PLAN_FILE"] == "/r/a/plan.json"
    assert env["DSSUP_RUN_TOKEN"] == "r/3"
    for key in ("DSSUP_RECOMPUTE", "DSSUP_ZERO_STAGE", "DSSUP_OFFLOAD", "DSSUP_CHECKPOINT_DIR"):
        assert key in env
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    alloc = PLAN.model_copy(update={"expandable_segments": True})
    assert (
        contract_env(
            alloc,
            attempt=1,
            run_id="r",
            run_dir=Path("/r"),
            attempt_dir=Path("/a"),
            token="t",
            resume_from=None,
            checkpoint_dir=None,
        )["PYTORCH_CUDA_ALLOC_CONF"]
        == "expandable_segments:True"
    )


def test_runtime_reads_what_the_supervisor_writes(tmp_path):
    from dssup.runtime import read_plan
    from dssup.supervisor.contract import write_plan_file

    write_plan_file(tmp_path / "plan.json", PLAN, 3)
    env = contract_env(
        PLAN,
        attempt=3,
        run_id="r",
        run_dir=tmp_path,
        attempt_dir=tmp_path,
        token="t",
        resume_from=None,
        checkpoint_dir=tmp_path,
    )
    plan = read_plan(micro_batch=99, grad_accum=99, env=env)
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch) == (4, 8, 64)
    assert plan.under_dssup and plan.attempt == 3 and plan.resume_from is None
    plan.check(dp_size=2)
    bare = read_plan(micro_batch=16, grad_accum=1, global_batch=32, env={})
    assert (bare.micro_batch, bare.under_dssup) == (16, False)


def test_job_output_is_unbuffered_unless_the_user_chose(tmp_path, monkeypatch):
    """Fast-fail SIGKILLs the attempt; buffered stdout would lose what ranks printed before."""
    from dssup.supervisor.attempt import build_spec
    from dssup.supervisor.command import parse_command

    cmd = parse_command(["torchrun", "--nproc-per-node", "2", "train.py"])

    def spec(n: int):
        return build_spec(
            cmd, PLAN, number=n, run_id="r", run_dir=tmp_path, resume=None,
            checkpoint_dir=None, adapters=(),
        )  # fmt: skip

    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    assert spec(1).env["PYTHONUNBUFFERED"] == "1"
    monkeypatch.setenv("PYTHONUNBUFFERED", "")  # the user's choice wins (inherited as is)
    assert "PYTHONUNBUFFERED" not in spec(2).env
