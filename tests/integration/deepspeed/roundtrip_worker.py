"""Torchrun worker for the conversion round-trip tests: many checks per launch.

A launch costs ~10 s here, so one launch trains, saves, converts and reloads several engines in
turn. For each case: an engine at the source stage trains two steps and saves; its whole state
(fp32 weights, Adam moments) is gathered as the reference and its next step's loss is the
unconverted control; rank 0 converts through dssup; a fresh engine at the target stage loads
the result. Rank 0 writes ``results-<phase>.json``; the pytest side asserts on it.

Phases (``--phase``): ``stages`` (2 ranks: 1→2, 1→3, 2→3, 3→1, 0→3, plus a DP-2 checkpoint for
``shrink``), ``shrink`` (1 rank: DP 2→1, then saves a DP-1 checkpoint for ``grow``), ``grow``
(2 ranks: DP 1→2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "deepspeed"))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import train_ds  # noqa: E402  (sets DS_ACCELERATOR before deepspeed is imported)

from dssup.supervisor.deepspeed.ckpt_info import read_checkpoint  # noqa: E402
from dssup.supervisor.deepspeed.config import derive_plan  # noqa: E402
from dssup.supervisor.deepspeed.convert import prepare_resume  # noqa: E402
from dssup.supervisor.deepspeed.render import render_config  # noqa: E402

GB = 8
ARGS = train_ds.parse_args(["--deepspeed_config", "unused", "--steps", "3"])


BF16 = {"on": False}  # phase "bf16" trains every engine in bf16


def ds_config(stage: int, universal: bool = False, offload: str = "none") -> dict[str, Any]:
    """The user's JSON, or (with offload) the one dssup's renderer writes for that plan."""
    dp = dist.get_world_size()
    cfg: dict[str, Any] = {
        "train_batch_size": GB,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": GB // (2 * dp),
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10_000,
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if BF16["on"]:
        cfg["bf16"] = {"enabled": True}
    if offload != "none":
        plan = derive_plan(cfg, dp).model_copy(
            update={
                "offload_optimizer": "cpu",
                "offload_param": "cpu" if offload == "all" else "none",
            }
        )
        cfg, _ = render_config(cfg, plan)
    return cfg


def engine_at(stage: int, universal: bool = False, offload: str = "none") -> Any:
    torch.manual_seed(train_ds.MODEL_SEED)
    model = train_ds.TinyNet(ARGS.d_in, ARGS.width, ARGS.depth)
    opt = torch.optim.AdamW(model.parameters(), lr=ARGS.lr, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, config=ds_config(stage, universal, offload)
    )
    return engine


def train_and_save(stage: int, save: Path, data: Any) -> tuple[dict[str, Any], float]:
    """Two steps, save, gather the reference state, then the control's next-step loss."""
    engine = engine_at(stage)
    for step in range(2):
        train_ds.train_step(engine, step, ARGS, data)
    engine.save_checkpoint(str(save), tag="global_step2")
    dist.barrier()  # every rank's shard is on disk before rank 0 inspects the checkpoint
    ref = train_ds.full_state(engine)
    control = train_ds.train_step(engine, 2, ARGS, data)
    return ref, control


def compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"weights_equal": True, "moments_equal": True, "mismatch": []}
    for name, entry in ref.items():
        for key, value in entry.items():
            other = got.get(name, {}).get(key)
            if other is None or not torch.equal(value, other):
                out["weights_equal" if key == "fp32" else "moments_equal"] = False
                out["mismatch"].append(f"{name}/{key}")
    out["compared"] = sum(len(e) for e in ref.values())
    return out


def convert_on_rank0(save: Path, stage: int, cache: Path, force: bool) -> dict[str, Any]:
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        info = read_checkpoint(save)
        resume = prepare_resume(info, stage, dist.get_world_size(), cache, force_universal=force)
        box[0] = resume.model_dump(mode="json")
    dist.broadcast_object_list(box, src=0)
    return dict(box[0])


def load_and_check(
    name: str,
    stage: int,
    save: Path,
    cache: Path,
    ref: Any,
    control: float,
    data: Any,
    force: bool = False,
    offload: str = "none",
    resave: Path | None = None,
) -> dict[str, Any]:
    resume = convert_on_rank0(save, stage, cache, force)
    if resume["load_dir"] is None:
        raise RuntimeError(f"{name}: no load path: {resume['reason']}")
    engine = engine_at(stage, universal=resume["load_universal"], offload=offload)
    engine.load_checkpoint(resume["load_dir"])
    result = compare(ref, train_ds.full_state(engine))
    result |= {"case": name, "resume": resume, "control_loss": control}
    result |= {"global_steps": engine.global_steps, "global_samples": engine.global_samples}
    result["engine"] = train_ds.engine_report(engine, engine.module)
    result["loss"] = train_ds.train_step(engine, 2, ARGS, data)
    if resave is not None:
        result["resave"] = resave_and_reload(engine, stage, resave, data)
    return result


def resave_and_reload(engine: Any, stage: int, save: Path, data: Any) -> dict[str, Any]:
    """After a universal load: save natively, check the tag is complete and loads directly
    with the same state (``load_universal`` only affects loading; DeepSpeed #7546)."""
    engine.save_checkpoint(str(save), tag="global_step3")
    dist.barrier()
    ref = train_ds.full_state(engine)
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        info = read_checkpoint(save)
        box[0] = None if info is None else info.model_dump(mode="json")
    dist.broadcast_object_list(box, src=0)
    fresh = engine_at(stage)
    fresh.load_checkpoint(str(save))
    out = compare(ref, train_ds.full_state(fresh))
    out["info"] = box[0]
    return out


def save_reference(path: Path, ref: Any, control: float) -> None:
    if dist.get_rank() == 0:
        torch.save({"ref": ref, "control": control}, path)


def phase_stages(work: Path, data: Any) -> list[dict[str, Any]]:
    results, saved = [], {}
    # (1, 2) loads natively; it is checked both ways: as dssup does it and forced universal.
    cases = ((1, 2, False), (1, 2, True), (1, 3, False), (2, 3, False), (3, 1, False))
    for src, dst, force in (*cases, (0, 3, False)):
        if src not in saved:
            saved[src] = train_and_save(src, work / f"ckpt-z{src}-dp2", data)
        ref, control = saved[src]
        save = work / f"ckpt-z{src}-dp2"
        case = f"stage {src}->{dst}" + (" (forced universal)" if force else "")
        resave = work / f"resaved-z{dst}" if (src, dst) == (1, 3) else None
        results.append(
            load_and_check(
                case, dst, save, work / "cache", ref, control, data, force, resave=resave
            )
        )
    # the JSON dssup writes for offload, and a converted checkpoint loaded into it
    for offload, dst in (("optimizer", 2), ("all", 3)):
        ref, control = saved[1]
        case = f"stage 1->{dst} + offload {offload}"
        results.append(
            load_and_check(
                case, dst, work / "ckpt-z1-dp2", work / "cache", ref, control, data, offload=offload
            )
        )
    save_reference(work / "ref-z2-dp2.pt", *train_and_save(2, work / "ckpt-z2-dp2", data))
    return results


def phase_shrink(work: Path, data: Any) -> list[dict[str, Any]]:
    saved = torch.load(work / "ref-z2-dp2.pt", weights_only=False)
    case = load_and_check(
        "dp 2->1 (stage 2)",
        2,
        work / "ckpt-z2-dp2",
        work / "cache",
        saved["ref"],
        saved["control"],
        data,
    )
    save_reference(work / "ref-z1-dp1.pt", *train_and_save(1, work / "ckpt-z1-dp1", data))
    return [case]


def phase_grow(work: Path, data: Any) -> list[dict[str, Any]]:
    saved = torch.load(work / "ref-z1-dp1.pt", weights_only=False)
    case = load_and_check(
        "dp 1->2 (stage 1)",
        1,
        work / "ckpt-z1-dp1",
        work / "cache",
        saved["ref"],
        saved["control"],
        data,
    )
    return [case]


def phase_bf16(work: Path, data: Any) -> list[dict[str, Any]]:
    BF16["on"] = True
    results = []
    for src, dst in ((1, 3), (3, 2)):
        ref, control = train_and_save(src, work / f"ckpt-bf16-z{src}", data)
        results.append(
            load_and_check(
                f"bf16 stage {src}->{dst}",
                dst,
                work / f"ckpt-bf16-z{src}",
                work / "cache",
                ref,
                control,
                data,
            )
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("stages", "shrink", "grow", "bf16"), required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    data = train_ds.dataset(4 * GB, ARGS.d_in)
    results = {
        "stages": phase_stages,
        "shrink": phase_shrink,
        "grow": phase_grow,
        "bf16": phase_bf16,
    }[args.phase](args.work, data)
    if dist.get_rank() == 0:
        (args.work / f"results-{args.phase}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
