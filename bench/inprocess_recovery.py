"""Time lost to one OOM: in-process recovery vs dssup's restart vs torchrun vs accelerate.

The same job (``bench/inprocess_worker.py``: train_tiny's transformer, 2 gloo ranks, global
batch 32 at micro-batch 16, checkpoints every 3 steps) and the same failure: the sequence
length grows from 32 to 384 at step 4 and micro-batch 16 no longer fits its "device", on rank
1 only or on both ranks. The device is an address-space cap sized by the job itself, as in
the tests (train_tiny's ``--memory-cap-at forward``, ``dssup.runtime.standin``): what the
first micro-batch of step 4 holds when its logits exist, plus 1 MiB, so its cross-entropy
fails in torch's own allocator (a real ``DefaultCPUAllocator`` failure) on any machine; the
budget found is kept in a file per rank, and every later try (a relaunch, a restart, a rerun)
runs under a device of that size. A fixed cap in MiB would measure one machine's libraries:
with 56 MiB here micro-batch 8 failed too, and dssup's restart went down to micro-batch 4.
Four ways to meet it:

* ``in-process``: ``dssup run`` around the job with ``StepGuard``: the ranks agree and redo
  step 4 at micro-batch 8;
* ``dssup restart``: ``dssup run`` around the same job without the guard: fast fail, relaunch
  at micro-batch 8 from the step-3 checkpoint;
* ``torchrun --max-restarts 1``: torchrun relaunches the same command; the script halves its
  micro-batch on each restart by hand (``TORCHELASTIC_RESTART_COUNT``) and resumes from its
  newest checkpoint: what a user would have to write;
* ``accelerate``: ``accelerate.utils.find_executable_batch_size`` (1.15) around the training
  function: rerun from the top with batch x0.9, each process alone, accumulation untouched.

Per run: **time lost** = wall time from the first OOM to the next completion of the step that
failed; **steps redone** = optimizer steps completed before the OOM and computed again after
it; the global batch after recovery; recovered or not (a run that makes no step for
``--hang-s`` after the OOM is stopped and counted as hung). Then the guard's **overhead** on
steps with no OOM (micro-batch 8 x 2 at length 384): steps of the plain loop and of the guard
interleaved in one job, medians and paired ratios, plus the verdict exchange alone.

    .venv/bin/python bench/inprocess_recovery.py [--runs 1] [--pairs 30] [--skip-recovery]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
WORKER = str(HERE / "inprocess_worker.py")
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
JOB = [
    "--steps",
    "6",
    "--checkpoint-every",
    "3",
    "--micro-batch-size",
    "16",
    "--memory-cap-at",
    "forward",
]
MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}


def _commands(method: str, tmp: Path, ranks: str) -> list[str]:
    job = [*JOB, "--memory-cap-ranks", ranks, "--checkpoint-dir", str(tmp / "ckpt"),
           "--memory-cap-file", str(tmp / "device" / "rank-{rank}.json")]  # fmt: skip
    dssup = [str(BIN / "dssup"), "run", "--quiet", "--run-dir", str(tmp / "run"),
             "--global-batch-size", "32", "--micro-batch-size", "16", "--backoff", "0.2", "--"]  # fmt: skip
    return {
        "in-process": [*dssup, *TORCHRUN, WORKER, "--mode", "guard", *job],
        "dssup restart": [*dssup, *TORCHRUN, WORKER, "--mode", "plain", *job],
        "torchrun --max-restarts 1": [*TORCHRUN[:1], "--max-restarts", "1", *TORCHRUN[1:], WORKER,
                                      "--mode", "plain", "--halve-on-restart", *job],
        "accelerate find_executable_batch_size": [*TORCHRUN, WORKER, "--mode", "accelerate", *job],
    }[method]  # fmt: skip


def _kill(proc: subprocess.Popen[bytes], tmp: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    needle = f"BENCH_EVENTS={tmp}".encode()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ProcessLookupError):
            if entry.isdigit() and needle in Path(f"/proc/{entry}/environ").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
    proc.wait()


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def once(method: str, ranks: str, hang_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dssup-inproc-bench-") as d:
        tmp = Path(d)
        events = tmp / "events.jsonl"
        env = {**os.environ, **MALLOC, "BENCH_EVENTS": str(events)}
        proc = subprocess.Popen(_commands(method, tmp, ranks), env=env, cwd=tmp, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        hung = False
        while proc.poll() is None:
            time.sleep(0.5)
            ev = _events(events)
            ooms = [e["t"] for e in ev if e["event"] == "oom"]
            if ooms and time.time() - max([e["t"] for e in ev]) > hang_s:
                hung = True
                _kill(proc, tmp)
        ev = _events(events)
    return _judge(ev, hung, proc.returncode)


def _judge(ev: list[dict[str, Any]], hung: bool, code: int | None) -> dict[str, Any]:
    ooms = sorted(e["t"] for e in ev if e["event"] == "oom")
    steps = [e for e in ev if e["event"] == "step" and e["rank"] == 0]
    if not ooms:
        return {"recovered": False, "note": f"no OOM seen (exit {code})"}
    t_oom = ooms[0]
    failed = min(e.get("step", 4) for e in ev if e["event"] == "oom")
    before = {e["step"] for e in steps if e["t"] < t_oom}
    after = [e for e in steps if e["t"] > t_oom]
    nxt = next((e for e in after if e["step"] == failed), None)
    redone = sorted({e["step"] for e in after if e["step"] in before})
    redone_count = sum(1 for e in after if e["step"] in before)
    long_steps = [
        b["t"] - a["t"]
        for a, b in itertools.pairwise(after)
        if b["step"] == a["step"] + 1 and a["step"] >= failed
    ]
    return {
        "recovered": nxt is not None and not hung and code == 0,
        "hung": hung,
        "time_lost_s": round(nxt["t"] - t_oom, 3) if nxt else None,
        "normal_step_s": round(statistics.median(long_steps), 3) if long_steps else None,
        "steps_redone": redone_count,
        "redone": redone,
        "global_batch_after": after[-1]["gb"] if after else None,
        "micro_batch_after": after[-1]["mb"] if after else None,
        "exit": code,
    }


def overhead(pairs: int) -> dict[str, Any]:
    res = subprocess.run(
        [*TORCHRUN, WORKER, "--mode", "overhead", "--micro-batch-size", "8", "--pairs", str(pairs)],
        env={**os.environ, **MALLOC}, capture_output=True, text=True, timeout=1800, check=True,
    )  # fmt: skip
    line = next(x for x in res.stdout.splitlines() if "OVERHEAD " in x)
    return json.loads(line.split("OVERHEAD ", 1)[1])


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=1, help="runs per method and failure")
    p.add_argument("--pairs", type=int, default=30, help="interleaved steps per mode (overhead)")
    p.add_argument("--hang-s", type=float, default=60.0, help="no step for this long: hung")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-recovery", action="store_true", help="the overhead part alone")
    args = p.parse_args()
    methods = [
        "in-process",
        "dssup restart",
        "torchrun --max-restarts 1",
        "accelerate find_executable_batch_size",
    ]
    print(f"load average before: {_load()}")
    print(
        "| method | OOM on | recovered | time lost (s) | normal step (s) | steps redone | global batch after | micro-batch after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for ranks in () if args.skip_recovery else ("1", "all"):
        for method in methods:
            for _ in range(args.runs):
                r = once(method, ranks, args.hang_s)
                status = (
                    "hung"
                    if r.get("hung")
                    else ("yes" if r["recovered"] else f"no ({r.get('note', r.get('exit'))})")
                )
                print(f"| {method} | {'rank 1' if ranks == '1' else 'both ranks'} | {status} | {r.get('time_lost_s')} | "
                      f"{r.get('normal_step_s')} | {r.get('steps_redone')} {r.get('redone', '')} | {r.get('global_batch_after')} | "
                      f"{r.get('micro_batch_after')} |", flush=True)  # fmt: skip
    print(f"load average after the recoveries: {_load()}")
    if not args.skip_overhead:
        o = overhead(args.pairs)
        plain = o["median_s"]["plain"]
        print(f"overhead, no OOM (micro-batch {o['micro_batch']} x {o['grad_accum']}, length "
              f"{o['seq']}, {o['pairs']} interleaved steps each; ratios: median of per-step "
              "ratios to the plain step next to it):")  # fmt: skip
        print(
            "| loop | median step (ms) | wall ratio | CPU ratio | guard's own time (ms) | own / plain step |"
        )
        print("|---|---|---|---|---|---|")
        for name, median in o["median_s"].items():
            own = o["own_s"][name] if name.startswith("guard") else None
            share = f"{own / plain:.3%}" if own is not None else ""
            own_ms = f"{own * 1000:.2f}" if own is not None else ""
            print(f"| {name} | {median * 1000:.1f} | {o['wall_ratio'][name]:.4f} | "
                  f"{o['cpu_ratio'][name]:.4f} | {own_ms} | {share} |")  # fmt: skip
        print("where the time goes (median ms per step):")
        for name, split in o["parts_s"].items():
            print(f"  {name}: " + ", ".join(f"{k} {t * 1000:.1f}" for k, t in split.items()))
        v = o["verdict_exchange_s"]
        print(f"verdict exchange alone: {v * 1e6:.0f} us = {v / plain:.3%} of a plain step")
        print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
