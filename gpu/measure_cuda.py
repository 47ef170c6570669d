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
Each child has a hard deadline; configs not reached are listed as skipped, never invented.
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


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
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
