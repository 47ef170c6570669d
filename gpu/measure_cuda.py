"""One prepared GPU run (<= 7 minutes): the report's configs measured on CUDA. NOT YET RUN.

Why: the CPU report validates the memory model at allocator level (L1) with CPU kernels. On a GPU
the kernels differ (SDPA backends, cuBLAS workspaces, 512 B rounding) and three more layers of
memory appear: the caching allocator's reserve (L2), the CUDA context and non-PyTorch allocations
(L3). This script measures, for the same small configs as docs/accuracy.md:

* baseline: CUDA context (``mem_get_info`` before/after ``torch.cuda.init``), cuBLAS and SDPA
  workspaces (after one warm-up GEMM and one attention call);
* per config, 2 AdamW steps: ``max_memory_allocated``, ``active_bytes.all.peak``,
  ``max_memory_reserved``, ``num_alloc_retries``, device used from ``mem_get_info``;
* both with and without ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (one child process
  each), and the derived defaults: context bytes, workspace bytes, fragmentation =
  reserved / allocated - 1 (median and max over configs).

Usage on the GPU machine (its own python3 with a CUDA torch; needs pydantic for dssup.memory):
    python3 gpu/measure_cuda.py            # writes gpu/results/<date>-<gpu>.json
    python3 gpu/measure_cuda.py --hf       # the transformers steps: <date>-<gpu>-hf.json
Each child has a hard deadline; configs not reached are listed as skipped, never invented.

``--hf`` (needs transformers 5.23.0 importable) runs the runs of bench/hf_measured.json -- the
same tiny transformers models, dtypes, attention implementations and checkpointing, AdamW
foreach, two steps -- on CUDA (``dssup.runtime.traced.build`` under ``torch.device("cuda")``)
and writes, per run id, ``max_memory_allocated`` and the reserve next to the CPU-measured peak
and the traced prediction (bench/hf_accuracy.json): the CPU -> CUDA kernel deltas of the
user's own model code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEADLINE_S = 180  # per allocator setting; two settings -> at most ~6.5 minutes with start-up


def _baseline() -> dict[str, int]:
    import torch as t

    free0, total = t.cuda.mem_get_info()  # initialises the context
    a = t.randn(4096, 4096, device="cuda")
    (a @ a).sum().item()
    q = t.randn(1, 8, 1024, 64, device="cuda", dtype=t.bfloat16)
    t.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().item()
    del a, q
    t.cuda.synchronize()
    t.cuda.empty_cache()
    free1, _ = t.cuda.mem_get_info()
    return {
        "total_bytes": total,
        "used_after_init_bytes": total - free0,
        "used_after_warmup_bytes": total - free1,
        "allocated_after_warmup_bytes": t.cuda.memory_allocated(),
    }


def _one(cfg: object) -> dict[str, object]:
    import torch as t

    from dssup.runtime.reference import build_model

    run = cfg.run  # type: ignore[attr-defined]
    t.cuda.empty_cache()
    t.cuda.reset_peak_memory_stats()
    model = build_model(run, device="cuda")
    kind = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}
    opt = t.optim.AdamW(model.parameters(), lr=1e-4, **kind[run.optimizer])
    tokens = t.randint(0, run.model.vocab, (run.micro_batch, run.seq_len), device="cuda")
    start = time.perf_counter()
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        with t.autocast("cuda", dtype=t.bfloat16, enabled=run.dtype == "amp"):
            loss = model(tokens)
        loss.backward()
        del loss
        opt.step()
    t.cuda.synchronize()
    stats = t.cuda.memory_stats()
    free, total = t.cuda.mem_get_info()
    out = {
        "id": cfg.id,  # type: ignore[attr-defined]
        "max_memory_allocated": t.cuda.max_memory_allocated(),
        "active_bytes_peak": stats.get("active_bytes.all.peak", 0),
        "max_memory_reserved": t.cuda.max_memory_reserved(),
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "device_used_bytes_end": total - free,
        "seconds": time.perf_counter() - start,
    }
    del model, opt, tokens
    return out


def child(setting: str) -> None:
    """Measure every config in this process until the deadline; print one JSON object."""
    from bench.accuracy_configs import CONFIGS

    began = time.perf_counter()
    result: dict[str, object] = {"setting": setting, "baseline": _baseline(), "configs": []}
    skipped = []
    for cfg in CONFIGS:
        if time.perf_counter() - began > DEADLINE_S - 20:
            skipped.append(cfg.id)
            continue
        try:
            result["configs"].append(_one(cfg))  # type: ignore[union-attr]
        except Exception as exc:  # a config that fails is recorded, not hidden
            skipped.append(f"{cfg.id}: {type(exc).__name__}: {exc}")
    result["skipped"] = skipped
    sys.stdout.write(json.dumps(result) + "\n")


def _derive(settings: list[dict[str, object]]) -> dict[str, object]:
    import statistics

    base = settings[0]["baseline"]
    frag: dict[str, list[float]] = {}
    for s in settings:
        frag[str(s["setting"])] = [
            c["max_memory_reserved"] / c["max_memory_allocated"] - 1  # type: ignore[index,operator]
            for c in s["configs"]  # type: ignore[union-attr]
            if c["max_memory_allocated"]  # type: ignore[index]
        ]
    return {
        "cuda_context_bytes": base["used_after_init_bytes"],  # type: ignore[index]
        "workspace_bytes": base["used_after_warmup_bytes"] - base["used_after_init_bytes"],  # type: ignore[index,operator]
        "fragmentation": {
            k: {"median": statistics.median(v), "max": max(v)} for k, v in frag.items() if v
        },
    }


def _one_hf(run: dict[str, object]) -> dict[str, object]:
    import torch as t

    from bench.hf_dataset import source
    from dssup.runtime.traced import Knobs, TracedRun
    from dssup.runtime.traced.build import build, loss_of

    knobs = Knobs.model_validate(run["knobs"])
    t.cuda.empty_cache()
    t.cuda.reset_peak_memory_stats()
    with t.device("cuda"):
        job = build(TracedRun(source=source(str(run["model"])), knobs=knobs))
        opt = t.optim.AdamW(job.model.parameters(), lr=1e-4, foreach=True)
        batch = job.make_batch(knobs.micro_batch, knobs.seq_len)
    start = time.perf_counter()
    for _ in range(knobs.steps):
        opt.zero_grad(set_to_none=True)
        with t.autocast("cuda", dtype=t.bfloat16, enabled=knobs.dtype == "amp"):
            loss = loss_of(job.call(job.model, batch))
        loss.backward()
        del loss
        opt.step()
    t.cuda.synchronize()
    out = {
        "id": run["id"],
        "max_memory_allocated": t.cuda.max_memory_allocated(),
        "max_memory_reserved": t.cuda.max_memory_reserved(),
        "cpu_peak_bytes": run["peak_bytes"],
        "cpu_phase": run["phase"],
        "seconds": time.perf_counter() - start,
    }
    del job, opt, batch
    return out


def child_hf() -> None:
    """The transformers runs until the deadline; one JSON object (predictions joined)."""
    measured = json.loads((ROOT / "bench" / "hf_measured.json").read_text())
    acc_path = ROOT / "bench" / "hf_accuracy.json"
    pred = {}
    if acc_path.exists():
        pred = {r["id"]: r["predicted"] for r in json.loads(acc_path.read_text())["rows"]}
    began = time.perf_counter()
    runs, skipped = [], []
    for run in measured["runs"]:
        if time.perf_counter() - began > 2 * DEADLINE_S - 20:
            skipped.append(run["id"])
            continue
        try:
            one = _one_hf(run)
        except Exception as exc:  # a run that fails is recorded, not hidden
            skipped.append(f"{run['id']}: {type(exc).__name__}: {exc}")
            continue
        one["cpu_predicted_bytes"] = pred.get(run["id"])
        runs.append(one)
    sys.stdout.write(json.dumps({"baseline": _baseline(), "runs": runs, "skipped": skipped}) + "\n")


def main_hf() -> int:
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("no CUDA device: nothing measured\n")
        return 1
    try:
        import transformers
    except ImportError:
        sys.stderr.write("transformers is not importable: nothing measured (see gpu/README.md)\n")
        return 1
    proc = subprocess.run(
        [sys.executable, __file__, "--child-hf"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=2 * DEADLINE_S + 40,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return proc.returncode
    gpu = torch.cuda.get_device_name(0)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        **json.loads(proc.stdout.strip().splitlines()[-1]),
    }
    name = f"{time.strftime('%Y-%m-%d')}-{gpu.replace(' ', '-')}-hf.json"
    out = ROOT / "gpu" / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / name).write_text(out.read_text())
    sys.stdout.write(f"wrote {out}\n")
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    if sys.argv[1:] == ["--child-hf"]:
        child_hf()
        return 0
    if sys.argv[1:] == ["--hf"]:
        return main_hf()
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("no CUDA device: nothing measured\n")
        return 1
    settings = []
    for setting in ("default", "expandable_segments:True"):
        env = dict(os.environ)
        if setting != "default":
            env["PYTORCH_CUDA_ALLOC_CONF"] = setting
        proc = subprocess.run(
            [sys.executable, __file__, "--child", setting],
            capture_output=True,
            text=True,
            env=env,
            timeout=DEADLINE_S + 40,
            check=False,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        settings.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    gpu = torch.cuda.get_device_name(0)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "settings": settings,
        "derived_defaults": _derive(settings),
    }
    name = f"{time.strftime('%Y-%m-%d')}-{gpu.replace(' ', '-')}.json"
    out = ROOT / "gpu" / "results" / name
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / name).write_text(out.read_text())
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
