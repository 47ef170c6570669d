"""Framework hand-offs: detection from the script's source, how each knob is received, the
worker arguments for a plan and a checkpoint, and what the framework prints read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dssup.jobreport import Started
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.command import parse_command
from dssup.supervisor.frameworks import Job, detect, read_source
from dssup.supervisor.frameworks.accelerate import VARIABLE
from dssup.supervisor.handoff import build_handoff
from dssup.supervisor.models import TrainingPlan

ROOT = Path(__file__).resolve().parents[3]
RUN_CLM = ROOT / "examples" / "hf" / "run_clm.py"
HF_LOG = ROOT / "tests" / "fixtures" / "supervisor" / "frameworks" / "hf_trainer_rank0.log"
PLAN = TrainingPlan(micro_batch=8, grad_accum=2, global_batch=32, dp=2, world_size=2)


def _job(tmp_path: Path, script: str, *args: str, source: str | None = None) -> Job:
    path = tmp_path / script
    if source is not None:
        path.write_text(source)
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", str(path), *args], env={})
    return Job(cmd, read_source(cmd, tmp_path))


def _hf(tmp_path: Path, *args: str) -> Job:
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", str(RUN_CLM), *args], env={})
    return Job(cmd, read_source(cmd, tmp_path))


def test_a_stock_run_clm_script_is_an_hf_trainer_job(tmp_path):
    job = _hf(tmp_path, "--per_device_train_batch_size", "16", "--output_dir", "out")
    framework, evidence = detect(job)
    assert framework.name == "hf-trainer" and "HfArgumentParser" in evidence
    ch = framework.channels(job)
    assert (ch["micro_batch"].via, ch["grad_accum"].via) == ("flag", "framework-flag")
    assert ch["recompute"].boolean and ch["resume"].name == "--resume_from_checkpoint"
    assert framework.initial(job) == {"micro_batch": 16}
    assert framework.initial(_hf(tmp_path)) == {}
    assert dict(framework.defaults) == {"micro_batch": 8, "grad_accum": 1}  # TrainingArguments'
    from dssup.cli.run import initial_plan

    plan = initial_plan(job.command, {"global_batch_size": 64}, [], {}, framework.defaults)
    assert (plan.micro_batch, plan.grad_accum) == (8, 4)  # HF's default batch, accumulation set
    assert framework.checkpoint_dir(job) == (Path("out"), "--output_dir")


def test_hf_flags_are_rewritten_appended_and_resumed(tmp_path):
    job = _hf(tmp_path, "--per_device_train_batch_size=16", "--output_dir", "out")
    framework, _ = detect(job)
    ckpt = CheckpointRef(Path("out/checkpoint-4"), 4, "hf")
    full = PLAN.model_copy(update={"recompute": "full"})
    assert framework.render(full, job, job.args, ckpt) == [
        "--per_device_train_batch_size=8", "--output_dir", "out",
        "--gradient_accumulation_steps", "2", "--gradient_checkpointing", "true",
        "--resume_from_checkpoint", "out/checkpoint-4",
    ]  # fmt: skip
    again = _hf(tmp_path, "--gradient_checkpointing", "--resume_from_checkpoint", "old")
    out = framework.render(PLAN, again, again.args, ckpt)
    assert out[:4] == ["--gradient_checkpointing", "false", "--resume_from_checkpoint",
                       "out/checkpoint-4"]  # fmt: skip


def test_hf_trainer_log_becomes_a_started_record_and_says_completion(tmp_path):
    job = _hf(tmp_path, "--output_dir", str(tmp_path / "out"))
    framework, _ = detect(job)
    text = HF_LOG.read_text()
    (rec,) = framework.reported(text)
    assert isinstance(rec, Started) and rec.source == "hf-trainer-log"
    assert (rec.micro_batch, rec.grad_accum, rec.dp, rec.global_batch, rec.first_step) == (
        8, 2, 2, 32, 4,
    )  # fmt: skip
    done = framework.completed(job, 0.0, text)
    assert done is not None and "Training completed" in done.training
    assert done.saved is None and "wrote no trainer_state.json" in done.unverified  # no files
    assert framework.completed(job, 0.0, "no such line") is None
    ckpt = tmp_path / "out" / "checkpoint-8"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 8, "max_steps": 8}))
    done = framework.completed(job, 0.0, "")
    assert done is not None and "training is complete" in done.training


def test_hf_without_resume_in_the_source_says_so(tmp_path):
    src = "from transformers import HfArgumentParser, TrainingArguments, Trainer\ntrainer.train()\n"
    job = _job(tmp_path, "t.py", "--output_dir", "o", source=src)
    handoff, _, framework = build_handoff(job.command, (), None, tmp_path)
    assert framework.name == "hf-trainer"
    assert not handoff.receives("resume")
    assert (
        "resume_from_checkpoint=training_args.resume_from_checkpoint"
        in handoff.channels["resume"].fix
    )
    assert any("no way to resume" in w for w in handoff.warnings)


# Megatron-LM's _print_args (megatron/training/arguments.py): '  {} {} {}'.format(arg,
# '.' * (48 - len(arg)), value), between "arguments" rules, on rank 0.
def _megatron_args(**values: int) -> str:
    rows = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(values.items())]
    return "\n".join(["------------------------ arguments ------------------------", *rows,
                      "-------------------- end of arguments ---------------------"])  # fmt: skip


def test_megatron_sets_micro_and_global_and_loads_the_save_dir(tmp_path):
    job = _job(tmp_path, "pretrain_gpt.py", "--micro-batch-size", "4", "--global-batch-size",
               "32", "--save", "ckpt", source="from megatron.training import pretrain\n")  # fmt: skip
    framework, _ = detect(job)
    assert framework.name == "megatron"
    assert framework.channels(job)["grad_accum"].via == "derived"
    ckpt = CheckpointRef(Path("ckpt/iter_0000004"), 4, "megatron")
    out = framework.render(PLAN.model_copy(update={"recompute": "full"}), job, job.args, ckpt)
    assert out == ["--micro-batch-size", "8", "--global-batch-size", "32", "--save", "ckpt",
                   "--recompute-granularity", "full", "--recompute-method", "uniform",
                   "--recompute-num-layers", "1", "--load", "ckpt"]  # fmt: skip
    (rec,) = framework.reported(_megatron_args(micro_batch_size=4, global_batch_size=32,
                                               data_parallel_size=2, world_size=2))  # fmt: skip
    assert (rec.micro_batch, rec.grad_accum, rec.dp, rec.global_batch) == (4, 4, 2, 32)


def test_lightning_cli_takes_accumulation_and_ckpt_path(tmp_path):
    src = "from lightning.pytorch.cli import LightningCLI\nLightningCLI(Model, Data)\n"
    job = _job(tmp_path, "cli.py", "fit", "--trainer.default_root_dir", "runs", source=src)
    framework, _ = detect(job)
    ch = framework.channels(job)
    assert framework.name == "lightning-cli" and not ch["micro_batch"].receives
    assert "--data.batch_size" in ch["micro_batch"].fix
    ckpt = CheckpointRef(Path("runs/epoch=0-step=4.ckpt"), 4, "torch-save")
    out = framework.render(PLAN, job, job.args, ckpt)
    assert out[-4:] == ["--trainer.accumulate_grad_batches", "2", "--ckpt_path",
                        "runs/epoch=0-step=4.ckpt"]  # fmt: skip


def test_an_accelerate_loop_gets_its_accumulation_from_the_environment(tmp_path):
    src = ("from accelerate import Accelerator\naccelerator = Accelerator()\n"
           "with accelerator.accumulate(model):\n    pass\n")  # fmt: skip
    job = _job(tmp_path, "loop.py", "--micro-batch-size", "16", source=src)
    framework, _ = detect(job)
    assert framework.channels(job)["grad_accum"].name == VARIABLE
    assert framework.environment(PLAN, job) == {VARIABLE: "2"}
    assert framework.render(PLAN, job, job.args, None) == ["--micro-batch-size", "8"]


@pytest.mark.parametrize(
    ("source", "args", "via", "words"),
    [
        ("p.add_argument('--gradient-accumulation-steps', type=int)\n", ["--micro-batch-size", "16"],
         "none", "add --gradient-accumulation-steps N to the command (your script defines it)"),
        ("import os\nos.environ['DSSUP_GRAD_ACCUM_STEPS']\n", [], "env", "names DSSUP_GRAD_ACCUM_STEPS"),
        ("plan = read_plan(16, 1)\n", [], "env", "read_plan"),
        ("", ["--gradient-accumulation-steps", "1"], "flag", "the command passes it"),
    ],
)  # fmt: skip
def test_a_plain_script_receives_accumulation_only_with_evidence(
    tmp_path, source, args, via, words
):
    job = _job(tmp_path, "train.py", *args, source=source)
    framework, _ = detect(job)
    ch = framework.channels(job)["grad_accum"]
    assert framework.name == "plain" and ch.via == via
    assert words in ch.evidence + " " + ch.fix + " " + ch.name


def test_a_module_script_is_found_on_the_path_without_importing_it(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('never imported')\n")
    (pkg / "train.py").write_text("from transformers import HfArgumentParser, TrainingArguments\n")
    cmd = parse_command(["torchrun", "-m", "pkg.train", "--output_dir", "o"], env={})
    source = read_source(cmd, tmp_path)
    assert source.path == pkg / "train.py"
    assert detect(Job(cmd, source))[0].name == "hf-trainer"
    missing = read_source(parse_command(["torchrun", "nope.py"], env={}), tmp_path)
    assert missing.text == "" and "not found" in missing.why
