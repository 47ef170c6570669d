"""The hand-off decides which remedies a script can receive, and a ladder that wastes no
attempt: knobs the script never sees are refused with the fix, plans that reach the script
identically are one config, the no-progress budget counts configs, recompute comes before
micro-batch 1 while no checkpoint exists, and a memory-model "nothing fits" is said in GiB
while the built-in rungs go on."""

from __future__ import annotations

from pathlib import Path

from dssup.memory import GiB, Layout, Training, preset
from dssup.supervisor.command import parse_command
from dssup.supervisor.handoff import build_handoff
from dssup.supervisor.jobview import JobView
from dssup.supervisor.modelplan import ModelStep
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner
from dssup.supervisor.state import RunState

ROOT = Path(__file__).resolve().parents[3]
OOM = Failure(kind=FailureKind.HOST_OOM, rank=1, phase="forward")
P16 = TrainingPlan(micro_batch=16, grad_accum=1, global_batch=32, dp=2, world_size=2)


def _view(tmp_path: Path, script: Path, *args: str) -> JobView:
    cmd = parse_command(["torchrun", "--nproc-per-node", "2", str(script), *args], env={})
    handoff, job, framework = build_handoff(cmd, (), None, tmp_path)
    return JobView(handoff, job, framework)


def _context(view: JobView, state: RunState):
    from dssup.supervisor.adapters import RemedyContext

    return RemedyContext(frozenset(state.tried), view.capabilities, "cpu",
                         view.check(state.plan, state.tried),
                         progress_saved=state.best_step is not None)  # fmt: skip


def _walk(view: JobView, plan: TrainingPlan, limit: int = 12):
    """Fail every config before any checkpoint, as the supervisor's loop would see it."""
    planner, state, seen = RemedyPlanner.default(), RunState(plan=plan), []
    state.walked = []  # type: ignore[attr-defined]
    while len(seen) < limit:
        state.walked.append(state.plan)  # type: ignore[attr-defined]
        state.tried.add(state.plan.key())
        state._fold(state.plan, OOM, 1, None)
        remedy = planner.decide(OOM, state.plan, _context(view, state))
        seen.append((state.no_progress, planner.skipped))
        if remedy is None:
            return seen, state, None
        state.plan = remedy.plan
    return seen, state, state.plan


def test_a_script_that_cannot_receive_accumulation_is_never_halved(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "p.add_argument('--micro-batch-size')\np.add_argument('--gradient-accumulation-steps')\n"
    )
    view = _view(tmp_path, script, "--micro-batch-size", "16")
    planner = RemedyPlanner.default()
    state = RunState(plan=P16, tried={P16.key()})
    assert planner.decide(OOM, P16, _context(view, state)) is None
    text = " ".join(planner.skipped)
    assert "accumulation 1 -> 2 cannot reach the script" in text
    assert "add --gradient-accumulation-steps N to the command (your script defines it)" in text
    assert len([s for s in planner.skipped if s.startswith("halve-micro-batch")]) == 1


def test_hf_selective_and_full_recompute_are_one_config(tmp_path):
    view = _view(tmp_path, ROOT / "examples" / "hf" / "run_clm.py",
                 "--per_device_train_batch_size", "2")  # fmt: skip
    plan = TrainingPlan(micro_batch=2, grad_accum=8, global_batch=32, dp=2, world_size=2)
    assert view.handoff.fingerprint(plan.model_copy(update={"recompute": "selective"})) == (
        view.handoff.fingerprint(plan.model_copy(update={"recompute": "full"}))
    )
    seen, state, _ = _walk(view, plan)
    plans = [(p.micro_batch, p.recompute) for p in state.walked]  # type: ignore[attr-defined]
    assert (2, "full") not in plans  # the same run as (2, selective): never launched
    assert plans[:3] == [(2, "none"), (2, "selective"), (1, "selective")]
    assert any("exactly what it received" in s for _, skipped in seen for s in skipped)


def test_before_the_first_checkpoint_recompute_comes_before_micro_batch_1(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from dssup.runtime import read_plan\nplan = read_plan(16, 1)\n")
    view = _view(tmp_path, script)
    seen, state, _ = _walk(view, P16, limit=5)
    configs = [(p.micro_batch, p.recompute) for p in state.walked]  # type: ignore[attr-defined]
    assert configs == [(16, "none"), (8, "none"), (4, "none"), (2, "none"), (2, "selective")]
    assert [n for n, _ in seen] == [1, 2, 3, 4, 5]  # one per distinct config, not per restart


def test_the_no_progress_budget_counts_configs_not_restarts():
    state = RunState(plan=P16)
    transient = Failure(kind=FailureKind.TRANSIENT)
    for _ in range(3):
        state._fold(P16, transient, 1, None)
    assert state.no_progress == 1
    state._fold(P16, transient, 1, 4)
    assert state.no_progress == 0 and state.best_step == 4


def test_nothing_fits_is_said_in_gib_and_the_builtin_ladder_still_runs():
    step = ModelStep(model=preset("llama-3-8b"), layout=Layout(tp=1, pp=1, dp=2),
                     base=Training(seq_len=4096), gpu_memory_bytes=4 * GiB)  # fmt: skip
    planner = RemedyPlanner.default(step)
    from dssup.supervisor.adapters import BUILTIN_CAPABILITIES, RemedyContext

    oom = Failure(
        kind=FailureKind.CUDA_OOM, rank=0, tried_to_allocate=1 << 30, in_use_bytes=4 * GiB
    )
    ctx = RemedyContext(frozenset({P16.key()}), BUILTIN_CAPABILITIES, "cuda")
    remedy = planner.decide(oom, P16, ctx)
    note = next(s for s in planner.skipped if s.startswith("memory-model"))
    assert "nothing that fits 4.00 GiB" in note and "GiB over" in note
    assert remedy is not None and remedy.step == "halve-micro-batch"


def test_the_jobs_report_is_evidence_the_source_could_not_give(tmp_path):
    """A wrapper that runs the real script (its source names nothing) is shown by the job's
    own report to take the batch from DSSUP_*: the halving becomes usable."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import runpy\nrunpy.run_path('train.py', run_name='__main__')\n")
    view = _view(tmp_path, wrapper)
    state = RunState(plan=P16, tried={P16.key()})
    assert RemedyPlanner.default().decide(OOM, P16, _context(view, state)) is None
    started = {"type": "started", "rank": 0, "env_knobs": ["grad_accum", "micro_batch", "resume"]}
    assert view.learn([started]) == ["grad_accum", "micro_batch", "resume"]
    assert view.handoff.channels["grad_accum"].name == "DSSUP_GRAD_ACCUM_STEPS"
    remedy = RemedyPlanner.default().decide(OOM, P16, _context(view, state))
    assert remedy is not None and (remedy.plan.micro_batch, remedy.plan.grad_accum) == (8, 2)
    assert view.learn([started]) == []  # already known
