"""The independent side of the accuracy report: measured training steps of transformers models.

    .venv/bin/python -m bench.hf_dataset                      # the whole grid -> bench/hf_measured.json
    .venv/bin/python -m bench.hf_dataset --only 'llama-gqa-tiny/*'   # a subset (fnmatch), printed
    .venv/bin/python -m bench.hf_dataset --resume             # measure what the file lacks

Every run is a real, allocating training step on CPU of the model transformers builds from one
of the configs in ``bench/hf_models/`` (tiny sizes of DeepSeek-V3, DeepSeek-V2-Lite, Llama-3 GQA,
Mixtral and Qwen1.5-MoE; sources in bench/hf_models/SOURCES.md), measured with PyTorch's
MemTracker and cross-checked against torch.profiler (``dssup.runtime.traced.step``). The grid:
fp32 / bf16 / amp, sdpa / eager attention, with and without activation checkpointing,
micro-batch 1, 2, 4, 8, sequence 256 and 512. The file's schema is documented in
docs/calibration.md ("The transformers dataset") and repeated in its ``schema`` field.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import multiprocessing
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from dssup.runtime.traced import HFSource, Knobs, TracedRun
from dssup.runtime.traced.build import versions
from dssup.runtime.traced.step import measure

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE / "hf_models"
OUT = HERE / "hf_measured.json"
MODELS = (
    "deepseek-v3-tiny",
    "deepseek-v2-lite-tiny",
    "llama-gqa-tiny",
    "mixtral-tiny",
    "qwen2-moe-tiny",
)
DTYPES = ("fp32", "bf16", "amp")
ATTENTIONS = ("sdpa", "eager")
CHECKPOINTING = (False, True)
MICRO_BATCHES = (1, 2, 4, 8)
SEQ_LENS = (256, 512)
STEPS = 2

SCHEMA = {
    "runs[].id": "model/dtype/attention/ckpt|nockpt/b<micro-batch>/s<seq-len>",
    "runs[].model": "file stem in bench/hf_models/ (the config.json transformers built)",
    "runs[].model_type": "the config's model_type",
    "runs[].knobs": "dssup.runtime.traced.Knobs: micro_batch, seq_len, dtype (fp32 | bf16 | amp "
    "= fp32 weights + bf16 autocast), attention (transformers attn_implementation), "
    "checkpointing (activation_checkpointing_enable, use_reentrant=False, every decoder layer), "
    "optimizer (torch AdamW: foreach), steps, seed",
    "runs[].peak_bytes": "allocator peak over all steps, MemTracker (bytes, CPU, no rounding)",
    "runs[].phase": "forward | backward | optimizer: phase holding the peak",
    "runs[].step": "1-based step holding the peak (AdamW state exists from step 1's optimizer)",
    "runs[].breakdown": "MemTracker categories at the peak (Parameter, Gradient, Optstate, "
    "Activation, Temp, Buffer, Other, Total), bytes",
    "runs[].profiler_peak_bytes": "torch.profiler's independent peak (bytes)",
    "runs[].phase_peaks": "'step:phase' -> MemTracker categories at that phase's own peak",
    "runs[].tail_peaks": "'step' -> categories at the end-of-backward peak (after the first "
    "decoder layer's output gradient is complete)",
    "runs[].parameters": "parameters of the model (sum of numel)",
    "runs[].blocks": "decoder layers per kind found in the module tree (dense, moe)",
    "runs[].seconds": "wall time of the measured steps",
    "step": "zero_grad(set_to_none=True); loss = model(input_ids=x, labels=x, use_cache=False)"
    ".loss (under autocast for amp); loss.backward(); AdamW.step(); twice",
}


def grid() -> list[tuple[str, str, Knobs]]:
    """(id, model, knobs) of every run of the dataset."""
    out = []
    for model, dtype, attn, ck, s, b in itertools.product(
        MODELS, DTYPES, ATTENTIONS, CHECKPOINTING, SEQ_LENS, MICRO_BATCHES
    ):
        knobs = Knobs(
            micro_batch=b, seq_len=s, dtype=dtype, attention=attn, checkpointing=ck, steps=STEPS
        )
        out.append((f"{model}/{dtype}/{attn}/{'ckpt' if ck else 'nockpt'}/b{b}/s{s}", model, knobs))
    return out


def source(model: str) -> HFSource:
    path = MODELS_DIR / f"{model}.json"
    return HFSource(config=json.loads(path.read_text()), path=str(path.relative_to(HERE.parent)))


def row(rid: str, model: str, knobs: Knobs) -> dict[str, Any]:
    """Measure one run (real, cross-checked) and keep what the dataset documents."""
    src = source(model)
    m = measure(TracedRun(source=src, knobs=knobs), "real")
    return {
        "id": rid,
        "model": model,
        "model_type": src.config["model_type"],
        "knobs": knobs.model_dump(mode="json"),
        "peak_bytes": m.peak_bytes,
        "phase": m.phase,
        "step": m.step,
        "breakdown": m.breakdown,
        "profiler_peak_bytes": m.profiler_peak_bytes,
        "phase_peaks": m.phase_peaks,
        "tail_peaks": m.tail_peaks,
        "parameters": m.parameters,
        "blocks": m.blocks,
        "seconds": round(m.seconds, 2),
    }


def _header() -> dict[str, Any]:
    return {
        "generated_by": "python -m bench.hf_dataset",
        "versions": {**versions(), "python": platform.python_version()},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads 1",
        "schema": SCHEMA,
    }


def _measure(task: tuple[str, str, Knobs]) -> dict[str, Any]:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    start = time.perf_counter()
    r = row(*task)
    print(
        f"{r['id']:45s} {r['peak_bytes'] / 2**20:9.2f} MiB {r['phase']:9s} "
        f"{time.perf_counter() - start:5.1f} s",
        flush=True,
    )
    return r


def write(doc: dict[str, Any], path: Path) -> None:
    """The dataset, one run per line, written atomically (an interrupted run keeps every row)."""
    head = {k: v for k, v in doc.items() if k != "runs"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "runs": [\n'
    text += ",\n".join(json.dumps(r, separators=(",", ":")) for r in doc["runs"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n ]\n}\n")
    tmp.replace(path)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="run ids or fnmatch patterns")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--resume", action="store_true", help="keep the rows --out already has")
    ap.add_argument("--jobs", type=int, default=1, help="runs measured in parallel")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    todo = grid()
    if args.only is not None:
        todo = [t for t in todo if any(fnmatch.fnmatch(t[0], p) for p in args.only)]
    doc: dict[str, Any] = {**_header(), "runs": []}
    if args.resume and args.out.exists():
        doc["runs"] = json.loads(args.out.read_text())["runs"]
    have = {r["id"] for r in doc["runs"]}
    todo = [t for t in todo if t[0] not in have]
    keep = args.only is None or args.resume
    order = {t[0]: i for i, t in enumerate(grid())}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        for r in pool.imap_unordered(_measure, todo):
            if keep:
                doc["runs"] = sorted([*doc["runs"], r], key=lambda x: order[x["id"]])
                doc["generated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                write(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
