"""Regenerate docs/accuracy.md: predicted vs measured allocator peak over the report's configs.

    .venv/bin/python -m bench.accuracy --json-out bench/accuracy.json   # all; docs/accuracy.md
    .venv/bin/python -m bench.accuracy --rerender bench/accuracy.json   # re-predict only
    .venv/bin/python -m bench.accuracy --only ID ...  # a subset, printed only
    .venv/bin/python -m bench.accuracy --add bench/accuracy.json  # measure configs it lacks
    .venv/bin/python -m bench.accuracy --recalibrate bench/accuracy.json [--only ID ...]
        # re-trace the profiles (of the groups of ID ...), keep measurements, re-predict

For each config the eager profile of its (model, dtype, optimizer) is traced first (FakeTensorMode,
one layer of each kind, micro-batch 1-2: ``dssup calibrate``), then the config itself is measured
(real CPU steps cross-checked with torch.profiler, or a full-shape fake trace) and compared with
``dssup.memory.estimate``. Remedy checks compare predicted and measured savings of halving the
micro-batch, raising the recompute level, raising the ZeRO stage and offloading the optimizer
(rank 0 of a data-parallel job: ``dssup.runtime.reference.zero``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.accuracy_configs import CONFIGS, Config, calibration_id, calibration_key, saved_id
from dssup.memory import Overheads, estimate
from dssup.memory.profile import EagerProfile
from dssup.runtime.reference import RunSpec
from dssup.runtime.reference.calibrate import calibrate
from dssup.runtime.reference.measure import measure

NO_OVERHEADS = Overheads(comm_buffer_bytes=0, fragmentation=0.0, cuda_context_bytes=0)
LOW, HIGH, DROPLESS_HIGH = -0.02, 0.04, 0.10


@dataclass
class Row:
    id: str
    mode: str
    measured: int
    predicted: int
    error: float
    phase: str
    predicted_phase: str
    seconds: float
    dropless: bool
    megatron: int = 0  # the uncalibrated `megatron` convention, for comparison

    @property
    def megatron_error(self) -> float:
        return (self.megatron - self.measured) / self.measured

    @property
    def ok(self) -> bool:
        high = DROPLESS_HIGH if self.dropless else HIGH
        low = 0.0 if self.dropless else LOW
        return low <= self.error <= high


def predict_megatron(run: RunSpec) -> int:
    """What the default convention (Megatron kernels, no eager profile) predicts."""
    est = estimate(run.model, run.to_layout(), run.to_training(), NO_OVERHEADS)
    return est.peak.bytes.allocated


def predict(run: RunSpec, profile: EagerProfile) -> tuple[int, str]:
    """Allocator peak (no device overheads) and phase the estimator predicts for ``run``."""
    training = run.to_training().model_copy(update={"implementation": profile})
    est = estimate(run.model, run.to_layout(), training, NO_OVERHEADS)
    return est.peak.bytes.allocated, est.peak_phase


class Calibrations:
    """Traces each (model, dtype, optimizer, sequence) once and reuses the profile."""

    def __init__(self) -> None:
        self.cache: dict[str, EagerProfile] = {}
        self.seconds: dict[str, float] = {}

    def get(self, run: RunSpec) -> EagerProfile:
        key = calibration_key(run)
        k = calibration_id(run)
        if k not in self.cache:
            start = time.perf_counter()
            self.cache[k] = calibrate(key)
            self.seconds[f"{run.model.name}/{run.dtype}/{run.optimizer}"] = (
                time.perf_counter() - start
            )
        return self.cache[k]


def evaluate(config: Config, cals: Calibrations) -> Row:
    """Calibrate (cached), measure and predict one config."""
    profile = cals.get(config.run)
    meas = measure(config.run, config.mode)
    pred, pred_phase = predict(config.run, profile)
    return Row(
        id=config.id,
        mode=config.mode,
        measured=meas.peak_bytes,
        predicted=pred,
        error=(pred - meas.peak_bytes) / meas.peak_bytes,
        phase=meas.phase,
        predicted_phase=pred_phase,
        seconds=meas.seconds,
        dropless=config.run.moe_routing == "dropless",
        megatron=predict_megatron(config.run),
    )


def _remedy_pairs(ids: set[str]) -> list[tuple[str, str, str]]:
    """(remedy, before, after) pairs present in ``ids``."""
    out = []
    for cid in sorted(ids):
        parts = cid.split("/")
        b = int(parts[3][1:])
        if b > 1:
            half = "/".join([*parts[:3], f"b{b // 2}", *parts[4:]])
            if half in ids:
                out.append(("micro-batch halved", cid, half))
        up = {"none": "selective", "selective": "full"}.get(parts[4])
        if up is not None:
            after = "/".join([*parts[:4], up, *parts[5:]])
            if after in ids:
                out.append((f"recompute {parts[4]} -> {up}", cid, after))
        out += _state_pairs(cid, ids)
    return out


def _state_pairs(cid: str, ids: set[str]) -> list[tuple[str, str, str]]:
    """ZeRO up one stage (same dp) and optimizer offload pairs starting at ``cid``."""
    out = []
    if "/offload" not in cid and f"{cid}/offload" in ids:
        out.append(("optimizer offload", cid, f"{cid}/offload"))
    found = re.search(r"/dp(\d+)-z(\d)(?=/|$)", cid)
    if found is not None and "/offload" not in cid:
        dp, z = found.groups()
        after = cid.replace(found.group(0), f"/dp{dp}-z{int(z) + 1}")
        if after in ids:
            out.append((f"ZeRO {z} -> {int(z) + 1} (dp {dp})", cid, after))
    return out


def remedies(rows: list[Row]) -> list[dict[str, object]]:
    """Predicted vs measured saving of each remedy pair; within 5 % of the measured saving
    (or, when nothing is saved, within 0.5 % of the peak)."""
    by_id = {r.id: r for r in rows}
    out: list[dict[str, object]] = []
    for remedy, before, after in _remedy_pairs(set(by_id)):
        a, b = by_id[before], by_id[after]
        measured = a.measured - b.measured
        predicted = a.predicted - b.predicted
        slack = max(0.05 * abs(measured), 0.005 * a.measured)
        out.append(
            {
                "remedy": remedy,
                "config": before,
                "measured_saving": measured,
                "predicted_saving": predicted,
                "deviation": (predicted - measured) / measured if measured else None,
                "ok": abs(predicted - measured) <= slack,
            }
        )
    return out


def _mib(x: int) -> str:
    return f"{x / 2**20:,.2f}"


def render(
    rows: list[Row],
    rem: list[dict[str, object]],
    cals: Calibrations,
    added: list[str] | None = None,
    recalibrated: list[str] | None = None,
    without_tail: int = 0,
) -> str:
    """The markdown report."""
    errs = [abs(r.error) for r in rows if not r.dropless]
    ok = sum(r.ok for r in rows)
    worst_under = min(r.error for r in rows)
    lines = [
        "# Accuracy of the memory model against measured PyTorch memory",
        "",
        "Generated by `.venv/bin/python -m bench.accuracy --rerender bench/accuracy.json` from "
        "bench/hf_accuracy.json (the independent check, first) and bench/accuracy.json (the "
        "self-check, second) -- do not edit by hand.",
        "",
        *_independent(),
        "## Self-check: dssup's reference blocks on both sides",
        "",
        "Both sides of this section are dssup's own code: the profile is traced from the "
        "reference blocks (`dssup.runtime.reference`) it is then checked against, so it "
        "validates the estimator's assembly, not the blocks' fidelity to real models (the "
        "section above does that).",
        "",
        "Generated by `.venv/bin/python -m bench.accuracy --json-out bench/accuracy.json` (measurements; about 10 min with --jobs 6 on 2 busy cores).",
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; this report rendered "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (not the measurement time).",
        *[f"Then `--add bench/accuracy.json`: {x}." for x in added or []],
        *[f"Then `--recalibrate bench/accuracy.json`: {x}." for x in recalibrated or []],
        *(
            [
                f"{without_tail} saved profile(s) predate the end-of-backward term (none of their "
                "rows offloads the optimizer, so the optimizer step covers it)."
            ]
            if without_tail
            else []
        ),
        "",
        "Measured: allocator peak (MemTracker) over 2 AdamW steps of the reference model "
        "(`dssup.runtime.reference`); `real` runs are cross-checked against torch.profiler "
        "memory events (a mismatch aborts the report), `fake` runs are FakeTensorMode traces at "
        "full shapes. Predicted: `dssup.memory.estimate(...)` with the `eager` profile from "
        "`dssup calibrate` of the same model/dtype/optimizer (one layer of each kind traced at "
        "micro-batch 1-2; the measured config itself is never traced for its prediction). "
        "Device overheads (fragmentation, CUDA context, buffers) are zero here: CPU, allocator "
        "level L1.",
        "",
        "### Summary",
        "",
        f"- configs: {len(rows)}; within target: {ok}/{len(rows)} "
        f"({ok / len(rows):.0%}; target >= 95 %; dense and capacity MoE -2 %/+4 %, "
        "dropless MoE 0/+10 %)",
        f"- median |error| (non-dropless): {statistics.median(errs or [0.0]):.2%} (target <= 2 %)",
        f"- worst under-prediction: {worst_under:+.2%} (target: never below -2 %)",
        f"- phase of the peak predicted correctly: {sum(_same_phase(r) for r in rows)}/{len(rows)}",
        f"- remedy savings within tolerance: {sum(bool(x['ok']) for x in rem)}/{len(rem)}",
        "",
        "### Configs",
        "",
        "The last column is the uncalibrated `megatron` convention (Megatron kernels) on the "
        "same config, to show what the `eager` profile corrects; it is not the target.",
        "",
        "| config | mode | measured MiB | predicted MiB | error | measured phase | "
        "predicted phase | ok | megatron convention |",
        "|---|---|---:|---:|---:|---|---|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.id} | {r.mode} | {_mib(r.measured)} | {_mib(r.predicted)} | "
            f"{r.error:+.2%} | {r.phase} | {r.predicted_phase} | {'yes' if r.ok else 'NO'} | "
            f"{r.megatron_error:+.1%} |"
        )
    lines += [
        "",
        "### Remedy savings",
        "",
        "| remedy | from config | measured saving MiB | predicted saving MiB | deviation | ok |",
        "|---|---|---:|---:|---:|---|",
    ]
    for x in rem:
        dev = x["deviation"]
        dev_s = f"{dev:+.1%}" if isinstance(dev, float) else "n/a (nothing saved)"
        lines.append(
            f"| {x['remedy']} | {x['config']} | {_mib(int(str(x['measured_saving'])))} | "
            f"{_mib(int(str(x['predicted_saving'])))} | {dev_s} | {'yes' if x['ok'] else 'NO'} |"
        )
    lines += [
        "",
        "### What this shows and what it does not",
        "",
        "- The prediction uses a profile traced from the *same implementation at the same "
        "hidden sizes* (one and two layers, micro-batch 1-2, one step); what is validated is the "
        "estimator's assembly around it -- exact parameter/gradient/optimizer bytes, the phase "
        "logic (gradients freed between steps, optimizer-step temporaries, the start- and "
        "end-of-backward peaks), and the extrapolation to more layers, larger micro-batches and other recompute "
        "levels. Near-zero errors are expected from that design, not a claim about an "
        "uncalibrated formula: the `megatron` column shows an uncalibrated formula is off by "
        "-36 % to +22 % on eager PyTorch.",
        "- Dropless MoE cannot be traced (data-dependent shapes): its profile comes from real "
        "small-shape steps of the reduced models (each cross-checked with torch.profiler). On one "
        "device a dropless layer holds exactly tokens x top-k routed slots, so no routing "
        "imbalance appears here; the expert-parallel imbalance bound is not exercised.",
        "- CPU allocator only (L1). CUDA kernels, fragmentation and the CUDA context are not "
        "covered: gpu/measure_cuda.py is prepared but has not run (no GPU was lent).",
        "- ZeRO and offload rows (`dpN-zK`, `offload`) measure rank 0 of an N-rank data-parallel "
        "job in one process: a fake process group (collectives are no-ops, all in place), the "
        "optimizer's slices as views of the parameters (ZeRO-1), each gradient reduced and "
        "freed in its accumulate hook (ZeRO-2), the host of an offloaded optimizer as the meta "
        "device (sizes, no storage; only the CPU, the accelerator here, is reported). What is "
        "validated is the sharding arithmetic and which phase holds the peak; NCCL buffers, "
        "bucketing and the real overlap of communication are not exercised. ZeRO-3 is not "
        "measured. Under offload the device keeps full gradients until the optimizer step (the "
        "model's assumption); DeepSpeed streams them to the host during backward instead.",
        "- With full recompute at micro-batch 1 and the optimizer offloaded, the measured peak is "
        "the end of backward (all gradients plus the first block's recomputed activations and "
        "backward temporaries). The eager profile's end-of-backward term is traced for it (the "
        "window from the first block's output gradient to the optimizer step, at micro-batch 1 "
        "and 2 of the one-layer model); whenever the optimizer is on the device the "
        "optimizer-step peak covers it. Profiles saved before the term existed lack it: "
        "`--recalibrate` re-traces them and keeps the measurements.",
        "",
        "### Calibration cost (FakeTensorMode traces, this machine)",
        "",
        *[f"- {k}: {v:.0f} s" for k, v in cals.seconds.items()],
        "",
    ]
    return "\n".join(lines)


def _independent() -> list[str]:
    """The transformers section, when its files exist (bench/hf_accuracy.py writes them)."""
    here = Path(__file__).resolve().parent
    rows_file, measured_file = here / "hf_accuracy.json", here / "hf_measured.json"
    if not rows_file.exists() or not measured_file.exists():
        return ["(The independent check has not been generated: run `python -m bench.hf_dataset` "
                "and `python -m bench.hf_accuracy --calibrate`.)", ""]  # fmt: skip
    from bench.hf_accuracy import render_section

    return render_section(json.loads(rows_file.read_text()), json.loads(measured_file.read_text()))


def _same_phase(r: Row) -> bool:
    measured_fb = r.phase in ("forward", "backward")
    return measured_fb == (r.predicted_phase == "forward-backward")


def _group(configs: list[Config]) -> tuple[list[Row], dict[str, float], dict[str, Any]]:
    """Calibrate once and evaluate every config of one calibration group (one process)."""
    torch.set_num_threads(1)
    cals = Calibrations()
    rows = []
    for c in configs:
        row = evaluate(c, cals)
        rows.append(row)
        print(f"{row.id:45s} {row.error:+.2%} {row.phase}/{row.predicted_phase}", flush=True)
    profiles = {k: v.model_dump(mode="json") for k, v in cals.cache.items()}
    return rows, cals.seconds, profiles


def _rerender(path: Path, out: Path) -> int:
    """Recompute every prediction from saved measurements and profiles; write the report."""
    doc = json.loads(path.read_text())
    rows = _repredict(doc)
    cals = Calibrations()
    cals.seconds = doc.get("calibration_seconds", {})
    old = sum(1 for v in doc["profiles"].values() if v.get("end_of_backward") is None)
    text = render(rows, remedies(rows), cals, doc.get("added"), doc.get("recalibrated"), old)
    out.write_text(text)
    return 0


def _repredict(doc: dict[str, Any]) -> list[Row]:
    """The saved rows with every prediction recomputed from the saved profiles."""
    configs = {c.id: c for c in CONFIGS}
    # keys saved before a field was added to the model spec re-read with its default
    profiles = {saved_id(k): EagerProfile.model_validate(v) for k, v in doc["profiles"].items()}
    rows = []
    for saved in doc["rows"]:
        run = configs[saved["id"]].run
        pred, phase = predict(run, profiles[calibration_id(run)])
        saved.update(
            predicted=pred,
            predicted_phase=phase,
            error=(pred - saved["measured"]) / saved["measured"],
            megatron=predict_megatron(run),
        )
        rows.append(Row(**saved))
    return rows


def _add(path: Path, out: Path, jobs: int) -> int:
    """Measure the configs a --json-out file lacks (calibrating their groups afresh), merge
    them in and re-render. A fresh profile must equal the saved one of the same group, or the
    saved rows are stale and the whole report has to be regenerated."""
    doc = json.loads(path.read_text())
    have = {r["id"] for r in doc["rows"]}
    todo = [c for c in CONFIGS if c.id not in have]
    new_rows, seconds, profiles = _run(todo, jobs)
    for k, v in profiles.items():
        if k in doc["profiles"] and doc["profiles"][k] != v:
            raise SystemExit(f"calibration changed since the report was generated: {k}")
    doc["profiles"].update(profiles)
    doc["calibration_seconds"] = {**seconds, **doc.get("calibration_seconds", {})}
    order = {c.id: i for i, c in enumerate(CONFIGS)}
    doc["rows"] = sorted(
        [*doc["rows"], *(asdict(r) for r in new_rows)], key=lambda r: order[r["id"]]
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["added"] = [*doc.get("added", []), f"{len(new_rows)} row(s) added on {stamp}"]
    rows = _repredict(doc)
    doc["remedies"] = remedies(rows)
    path.write_text(json.dumps(doc, indent=1))
    return _rerender(path, out)


def _calibrate_group(run: RunSpec) -> tuple[str, dict[str, Any], float]:
    """One group's profile, traced afresh (one process)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    profile = calibrate(calibration_key(run))
    return calibration_id(run), profile.model_dump(mode="json"), time.perf_counter() - start


def _recalibrate(path: Path, out: Path, jobs: int, only: list[str] | None) -> int:
    """Re-trace the profiles of the groups of ``only`` (every group if None) after the profile
    gained a term; the measurements stay, every prediction is recomputed."""
    doc = json.loads(path.read_text())
    runs: dict[str, RunSpec] = {}
    for c in CONFIGS:
        if only is None or c.id in only:
            runs.setdefault(calibration_id(c.run), c.run)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        results = pool.map(_calibrate_group, list(runs.values()), chunksize=1)
    names = []
    for (k, profile, secs), run in zip(results, runs.values(), strict=True):
        doc["profiles"][k] = profile
        name = f"{run.model.name}/{run.dtype}/{run.optimizer}"
        doc["calibration_seconds"][name] = secs
        names.append(name + ("/dropless" if run.moe_routing == "dropless" else ""))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["recalibrated"] = [
        *doc.get("recalibrated", []),
        f"profile(s) of {', '.join(names)} re-traced on {stamp}",
    ]
    doc["rows"] = [asdict(r) for r in _repredict(doc)]
    doc["remedies"] = remedies(_repredict(doc))
    path.write_text(json.dumps(doc, indent=1))
    return _rerender(path, out)


def _run(configs: list[Config], jobs: int) -> tuple[list[Row], dict[str, float], dict[str, Any]]:
    """Evaluate ``configs`` (one process per calibration group); rows in ``configs`` order."""
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(calibration_id(c.run), []).append(c)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        results = pool.map(_group, list(groups.values()), chunksize=1)
    by_id: dict[str, Row] = {}
    seconds: dict[str, float] = {}
    profiles: dict[str, Any] = {}
    for group_rows, secs, profs in results:
        by_id.update((r.id, r) for r in group_rows)
        seconds.update(secs)
        profiles.update(profs)
    return [by_id[c.id] for c in configs], seconds, profiles


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="config ids to run")
    ap.add_argument("--out", type=Path, default=Path("docs/accuracy.md"))
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=4, help="calibration groups run in parallel")
    ap.add_argument(
        "--rerender",
        type=Path,
        default=None,
        help="re-predict and re-render from a --json-out file (measurements and profiles kept)",
    )
    ap.add_argument(
        "--add",
        type=Path,
        default=None,
        help="measure the configs a --json-out file lacks, merge them in and re-render",
    )
    ap.add_argument(
        "--recalibrate",
        type=Path,
        default=None,
        help="re-trace the profiles of a --json-out file (of the --only configs' groups), "
        "keep its measurements, re-predict and re-render",
    )
    args = ap.parse_args(argv)
    if args.recalibrate is not None:
        return _recalibrate(args.recalibrate, args.out, args.jobs, args.only)
    if args.rerender is not None:
        return _rerender(args.rerender, args.out)
    if args.add is not None:
        return _add(args.add, args.out, args.jobs)
    configs = [c for c in CONFIGS if args.only is None or c.id in args.only]
    rows, seconds, profiles = _run(configs, args.jobs)
    cals = Calibrations()
    cals.seconds = seconds
    rem = remedies(rows)
    text = render(rows, rem, cals)
    if args.only is None:
        args.out.write_text(text)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(
            json.dumps(
                {
                    "rows": [asdict(r) for r in rows],
                    "remedies": rem,
                    "profiles": profiles,
                    "calibration_seconds": cals.seconds,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
