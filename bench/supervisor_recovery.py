"""How fast and how well does a job recover from an OOM? dssup vs torchrun vs accelerate.

Three ways to meet the same failure, on this machine's CPUs (2 gloo ranks):

1. ``dssup run``: rank 1 dies of an OOM at micro-batch 8; dssup classifies it, halves the
   micro-batch (accumulation doubled, global batch exact) and relaunches. Measured per run:
   worker death -> attempt stopped (with fast fail, dssup kills the attempt at the rank's
   error file, or, for a worker without ``@record``, at the traceback on its stderr; with
   ``--no-fast-fail``, torchrun's own teardown), torchrun exit -> next torchrun spawned
   (**dssup's overhead**: straggler check, evidence, classification, planning, journal,
   spawn), and death -> relaunch. Goal: under 1 s, with and without ``@record``.
2. ``torchrun --max-restarts 3`` on the same failure: it relaunches the same command, which
   dies the same way each time, and finally fails.
3. ``accelerate.find_executable_batch_size`` semantics (re-implemented here: accelerate is not
   a dependency): in-process, batch x0.9 on each OOM, accumulation untouched. Run for real on
   the example model under an address-space cap sized by the job itself (train_tiny's
   ``MemoryCap``, ``--memory-cap-at forward``: what micro-batch 16 holds when its logits exist,
   plus 1 MiB, the same on any machine): it survives, but the global batch changes.

    .venv/bin/python bench/supervisor_recovery.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
WORKER = str(HERE / "supervisor_oom_worker.py")
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]


def dssup_once(tmp: Path, fast_fail: bool = True, record: bool = True) -> dict[str, Any]:
    run = tmp / "run"
    env = {**os.environ, "BENCH_DEATH_FILE": str(tmp / "death"),
           "BENCH_NO_RECORD": "0" if record else "1"}  # fmt: skip
    t0 = time.time()
    res = subprocess.run(
        [str(BIN / "dssup"), "run", "--quiet", "--run-dir", str(run), "--global-batch-size", "16",
         "--micro-batch-size", "8", "--fast-fail" if fast_fail else "--no-fast-fail",
         "--", *TORCHRUN, WORKER],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    total = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"dssup run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    rec = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    ends = [r for r in rec if r["type"] == "attempt-ended"]
    death = float((tmp / "death.1").read_text())
    reports = [r["batch"] for r in rec if r["type"] == "job-report"]
    return {
        "death_to_attempt_stopped_s": ends[0]["exited_at"] - death,
        "dssup_overhead_s": ends[1]["spawned_at"] - ends[0]["exited_at"],
        "death_to_relaunch_s": ends[1]["spawned_at"] - death,
        "attempts": len(ends),
        "total_s": total,
        "batch": [f"{b['status']} {b.get('reported')}" for b in reports],
    }


def _with(record: bool) -> str:
    return "with @record" if record else "without @record"


def torchrun_max_restarts(tmp: Path, restarts: int = 3, timeout: float = 300) -> dict[str, Any]:
    """torchrun's own restarts. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, torch 2.13's
    restarted workers hung in init_process_group here (seen: 11 minutes), so it is set."""
    env = {**os.environ, "BENCH_DEATH_FILE": str(tmp / "tr-death"), "BENCH_MB": "8",
           "BENCH_START_FILE": str(tmp / "tr-start"),
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip
    t0 = time.time()
    proc = subprocess.Popen([*TORCHRUN, "--max-restarts", str(restarts), WORKER], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        code: int | str = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun stops its workers (they live in sessions of their own)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        code = f"hung after {timeout:.0f} s"

    def times(prefix: str) -> dict[int, float]:
        return {int(p.suffix[1:]): float(p.read_text()) for p in tmp.glob(f"{prefix}.*")}

    deaths, starts = times("tr-death"), times("tr-start")
    gaps = [starts[n + 1] - deaths[n] for n in deaths if n + 1 in starts]
    return {"exit_code": code, "oom_deaths": len(deaths), "total_s": time.time() - t0,
            "death_to_relaunch_s": statistics.median(gaps) if gaps else float("nan")}  # fmt: skip


ACCELERATE_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import train_tiny as t

def should_reduce_batch_size(exc):  # accelerate.utils.memory, same strings
    markers = [" out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
               "DefaultCPUAllocator: can't allocate memory"]
    return isinstance(exc, RuntimeError) and len(exc.args) == 1 and any(m in exc.args[0] for m in markers)

torch.set_num_threads(1)
t.own_kernels()
args = t.parse_args(["--memory-cap-at", "forward", "--memory-cap-step", "5"])
model, opt = t.build(args)
t.train_step(args, model, None, opt, 0, 0, 16, 16, 1)  # warm up at short sequences
# the device: a dry sample at the long length, then what micro-batch 16 of step 5 holds at
# its logits, plus 1 MiB (train_tiny's --memory-cap-at, as in the tests)
cap = t.MemoryCap(args, 0)
cap.start(model, lambda: t.dry_micro_batch(args, model, 5))
per_device, accum, world = 16, 1, 2   # the job asked for global batch 16 x 1 x 2 = 32
tried, t0 = [], time.time()
while True:                          # find_executable_batch_size, new semantics (x0.9)
    tried.append(per_device)
    try:
        t.train_step(args, model, None, opt, 5, 0, per_device * accum, per_device, accum, cap)
        break
    except Exception as exc:
        if not should_reduce_batch_size(exc):
            raise
        per_device = int(per_device * 0.9)
        if per_device == 0:
            raise RuntimeError("No executable batch size found, reached zero.")
print(json.dumps({"tried": tried, "final_per_device": per_device,
                  "global_before": 16 * accum * world, "global_after": per_device * accum * world,
                  "seconds": time.time() - t0}))
"""


def accelerate_semantics() -> dict[str, object]:
    res = subprocess.run(
        [sys.executable, "-c", ACCELERATE_CHILD, str(ROOT / "examples")],
        capture_output=True, text=True, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-fast-fail", action="store_true", help="let torchrun tear down first")
    args = p.parse_args()
    meds, batches = {}, {}
    for record in (True, False):
        rows = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(dssup_once(Path(tmp), not args.no_fast_fail, record))
            row = ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items() if k != "batch")
            print(f"dssup run {i + 1} ({_with(record)}): {row}; job's reports: "
                  f"{rows[-1]['batch']}", flush=True)  # fmt: skip
        meds[record] = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "batch"}
        batches[record] = sorted({b for r in rows for b in r["batch"]})
    with tempfile.TemporaryDirectory() as tmp:
        tr = torchrun_max_restarts(Path(tmp))
    acc = accelerate_semantics()
    print()
    for record, med in meds.items():
        how = (
            "torchrun teardown"
            if args.no_fast_fail
            else "fast fail: dssup kills at the " + ("error file" if record else "stderr traceback")
        )
        print(f"dssup run {_with(record)} (median of {args.runs}): recovered in "
              f"{med['attempts']:.0f} attempts; worker death -> attempt stopped "
              f"{med['death_to_attempt_stopped_s'] * 1000:.0f} ms ({how}), "
              f"torchrun exit -> relaunch {med['dssup_overhead_s'] * 1000:.0f} ms "
              f"(dssup overhead), death -> relaunch {med['death_to_relaunch_s'] * 1000:.0f} ms "
              f"(goal < 1000 ms); whole run {med['total_s']:.1f} s; global batch 16 as the "
              f"job reported it: {batches[record]}")  # fmt: skip
    print(f"torchrun --max-restarts 3: exit {tr['exit_code']}, the same OOM {tr['oom_deaths']} "
          f"times, never recovers; its own restart: death -> the relaunched worker started "
          f"{tr['death_to_relaunch_s'] * 1000:.0f} ms (median); {tr['total_s']:.1f} s")  # fmt: skip
    if "error" in acc:
        print(f"accelerate semantics: failed: {acc['error']}")
    else:
        print(f"accelerate find_executable_batch_size semantics: tried per-device batches "
              f"{acc['tried']}, survives at {acc['final_per_device']} with accumulation unchanged:"
              f" global batch {acc['global_before']} -> {acc['global_after']} (CHANGED); "
              f"{float(str(acc['seconds'])):.1f} s in-process")  # fmt: skip


if __name__ == "__main__":
    main()
