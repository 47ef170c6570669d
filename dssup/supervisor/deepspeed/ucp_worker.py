"""Checkpoint conversion, run as a child process: ``python -m dssup.supervisor.deepspeed.ucp_worker``.

Why a child: conversion needs torch and DeepSpeed, the supervisor must not import them, and a
crash or memory blow-up while converting must not take the supervisor down. The parent
(``convert.py``) picks the output directory, runs this, and trusts the result only when the
manifest ``dssup-conversion.json`` (written last) is there.

What it does, for DeepSpeed 0.19.8 (the pinned version; tested on every upgrade):

``universal``
    ``ds_to_universal`` (library call, ``--inject_missing_state``) turns a ZeRO 1-3 checkpoint
    into per-parameter fp32 weights and Adam moments. A stage-0 checkpoint has no ZeRO files
    for it to read, so its full optimizer state is written in the same layout here. Upstream
    loads the result only at the stage it came from; four small adjustments make it load at
    any stage 1-3 and any data-parallel size (tests/integration/deepspeed covers 1→2, 1→3,
    2→3, 3→1 and DP 2→1, 1→2):

    1. model-states names: ZeRO-3 looks for ``zero_pp_rank_0_mp_rank_XX_model_states.pt``,
       ZeRO 1/2 for ``mp_rank_XX_model_states.pt``; both are written;
    2. ``zero/optimizer_state.pt`` carries both layouts: the flat one ZeRO 1/2 read
       (``param_groups``, ``ds_version``, ...) and the nested one ZeRO-3 reads
       (``optimizer_state_dict.state[0].step``, ``optimizer_state_dict.param_groups``);
    3. per-parameter files are ``{"param": tensor}`` dicts (ZeRO-3 writes bare tensors, which
       the ZeRO 1/2 loader cannot index);
    4. every parameter gets a ``step.pt`` (ZeRO-3 writes none; ZeRO 1/2 read it).

``fp32``
    The last resort: consolidated fp32 weights (``zero_to_fp32``), no optimizer state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "adapt_universal", "main"]

MANIFEST = "dssup-conversion.json"
_KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def _torch() -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    return torch


def _load(path: Path) -> Any:
    return _torch().load(path, map_location="cpu", weights_only=False)


def _ds_to_universal(src: Path, out_tag: Path) -> None:
    from deepspeed.checkpoint import ds_to_universal

    ns = argparse.Namespace(
        input_folder=str(src),
        output_folder=str(out_tag),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(sys.stderr):  # it prints progress; keep stdout for JSON
        ds_to_universal.main(ns)


def _param_names(model_sd: dict[str, Any]) -> list[str]:
    buffers = set(model_sd.get("buffer_names") or ())
    return [n for n in model_sd["module"] if n not in buffers]


def _stage0_to_universal(src: Path, out_tag: Path) -> None:
    """A stage-0 checkpoint holds the whole torch optimizer state: lay it out per parameter."""
    torch = _torch()
    model_file = next(src.glob("mp_rank_*_model_states.pt"))
    sd = _load(model_file)
    optim = sd["optimizer"]
    if not isinstance(optim, dict) or set(optim) != {"state", "param_groups"}:
        # fp16/bf16 wrappers at stage 0 nest their state differently: not handled here.
        raise ValueError("stage-0 checkpoint without a plain torch optimizer state dict")
    names = _param_names(sd)
    order = [i for group in optim["param_groups"] for i in group["params"]]
    zero = out_tag / "zero"
    step = None
    for index, name in zip(order, names, strict=True):
        state = optim["state"].get(index, {})
        folder = zero / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"param": sd["module"][name].detach().float()}, folder / "fp32.pt")
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                torch.save({"param": state[key].float()}, folder / f"{key}.pt")
        step = state.get("step", step)
    groups = [
        {k: v for k, v in g.items() if k != "params"} | {"params": [0]}
        for g in optim["param_groups"]
    ]
    base: dict[str, Any] = {"dynamic_loss_scale": False, "overflow": False}
    base |= {"ds_version": sd.get("ds_version", ""), "param_groups": groups, "zero_stage": 0}
    base["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": groups}
    torch.save(base, zero / "optimizer_state.pt")
    shutil.copy2(model_file, out_tag / model_file.name)


def _step_of(optim_sd: dict[str, Any]) -> Any:
    nested = optim_sd.get("optimizer_state_dict") or {}
    state = nested.get("state") or {}
    if state:
        return next(iter(state.values())).get("step")
    return None


def adapt_universal(out_tag: Path, src: Path) -> None:
    """The four adjustments (module docstring) that let any stage 1-3 load the result."""
    torch = _torch()
    zero = out_tag / "zero"
    optim_path = zero / "optimizer_state.pt"
    optim_sd = _load(optim_path)
    step = _step_of(optim_sd)
    if step is None:  # ZeRO 1/2 layout: the step is in the per-parameter step.pt files
        any_step = next(zero.glob("*/step.pt"), None)
        step = _load(any_step) if any_step else None
    groups = optim_sd.get("param_groups") or (optim_sd.get("optimizer_state_dict") or {}).get(
        "param_groups", []
    )
    optim_sd["param_groups"] = groups
    optim_sd.setdefault(
        "optimizer_state_dict", {"state": {0: {"step": step}}, "param_groups": groups}
    )
    optim_sd.setdefault("ds_version", _src_version(src))
    optim_sd.pop("fp32_flat_groups", None)  # one rank's flat partition: unused by any loader
    torch.save(optim_sd, optim_path)
    for folder in (p for p in zero.iterdir() if p.is_dir()):
        for key in _KEYS:
            path = folder / f"{key}.pt"
            if path.is_file() and not isinstance(value := _load(path), dict):
                torch.save({"param": value}, path)
        if step is not None and not (folder / "step.pt").is_file():
            torch.save(step, folder / "step.pt")
    _both_model_state_names(out_tag)


def _src_version(src: Path) -> str:
    for path in sorted(src.glob("*_model_states.pt")):
        return str(_load(path).get("ds_version", ""))
    return ""


def _both_model_state_names(out_tag: Path) -> None:
    z3 = sorted(out_tag.glob("zero_pp_rank_0_mp_rank_*_model_states.pt"))
    flat = sorted(out_tag.glob("mp_rank_*_model_states.pt"))
    for path in z3:
        mp = path.name.split("_mp_rank_")[1]
        target = out_tag / f"mp_rank_{mp}"
        if not target.exists():
            shutil.copy2(path, target)
    for path in flat:
        target = out_tag / f"zero_pp_rank_0_{path.name}"
        if not target.exists():
            shutil.copy2(path, target)


def to_universal(src: Path, out_root: Path, stage: int) -> Path:
    out_tag = out_root / src.name
    if stage == 0:
        out_tag.mkdir(parents=True, exist_ok=True)
        _stage0_to_universal(src, out_tag)
    else:
        _ds_to_universal(src, out_tag)
    adapt_universal(out_tag, src)
    (out_root / "latest_universal").write_text(src.name)
    return out_tag


def to_fp32(src: Path, out_root: Path, stage: int) -> Path:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    if stage == 0:  # the model-states file holds the whole module
        model_sd = _load(next(src.glob("mp_rank_*_model_states.pt")))
        sd = {k: v.float() for k, v in model_sd["module"].items()}
    else:
        with contextlib.redirect_stdout(sys.stderr):
            sd = get_fp32_state_dict_from_zero_checkpoint(str(src.parent), tag=src.name)
    out_root.mkdir(parents=True, exist_ok=True)
    target = out_root / "pytorch_model_fp32.pt"
    _torch().save(sd, target)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dssup.supervisor.deepspeed.ucp_worker")
    ap.add_argument("--src", type=Path, required=True, help="the checkpoint's tag directory")
    ap.add_argument("--out", type=Path, required=True, help="empty directory to write into")
    ap.add_argument("--mode", choices=("universal", "fp32"), required=True)
    ap.add_argument("--stage", type=int, required=True, help="ZeRO stage the source was saved at")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.mode == "universal":
        result = to_universal(args.src, args.out, args.stage)
    else:
        result = to_fp32(args.src, args.out, args.stage)
    manifest = {
        "mode": args.mode,
        "src": str(args.src),
        "result": result.name,
        "seconds": round(time.monotonic() - t0, 3),
        "deepspeed": _ds_version(),
    }
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    sys.stdout.write(json.dumps(manifest) + "\n")
    return 0


def _ds_version() -> str:
    import deepspeed

    return str(deepspeed.__version__)


if __name__ == "__main__":
    sys.exit(main())
