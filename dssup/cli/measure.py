"""``dssup measure`` and ``dssup calibrate``: measured truth for the memory model, from the CLI.

``measure`` runs real CPU steps (or FakeTensorMode traces) of the plain-PyTorch reference model
and prints the allocator peak, its breakdown and its phase; with ``--calibration`` it also prints
the estimator's prediction and the signed error. ``calibrate`` traces one layer of each kind of a
model and writes the ``eager`` profile JSON the estimator uses. Both run the torch work in a child
process (``python -m dssup.runtime.reference``) so this CLI never imports torch or the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dssup.cli.app import main
from dssup.cli.hostmem import PROCESS_BYTES, SAFETY, available_bytes
from dssup.cli.options import load_profile
from dssup.cli.traced import run_child, source_options, traced_knobs, traced_source
from dssup.cli.values import BATCH, DEGREE, LAYERS, TRACE_SEQ_LEN, Choice, Existing, Real, Whole
from dssup.errors import ConfigError
from dssup.memory import Layout, ModelSpec, Overheads, Precision, Training, estimate
from dssup.memory.profile import EagerProfile
from dssup.memory.traced import TracedProfile
from dssup.modelio import load_model

__all__ = ["REFERENCE", "TRACED", "common_options", "measure_cmd", "reference_spec"]

_PRECISION = {
    "fp32": Precision(weights=4, gradients=4, master=0, moments=4, activations=4),
    "bf16": Precision(weights=2, gradients=2, master=0, moments=2, activations=2),
    "amp": Precision(weights=4, gradients=4, master=0, moments=4, activations=2),
}
REFERENCE = "dssup.runtime.reference"
TRACED = "dssup.runtime.traced"
_NO_OVERHEADS = Overheads(comm_buffer_bytes=0, fragmentation=0.0, cuda_context_bytes=0)


def reference_spec(o: dict[str, Any]) -> dict[str, Any]:
    model = load_model(o["model"])
    if o["layers"] is not None:
        if o["layers"] < 1:
            raise ConfigError("layers", "must be at least 1", "use --layers 1 or more")
        model = model.model_copy(update={"layers": o["layers"]})
    return {
        "model": model.model_dump(mode="json"),
        "micro_batch": o.get("micro_batch", 1),
        "seq_len": o["seq_len"],
        "recompute": o.get("recompute", "none"),
        "dtype": o["dtype"],
        "optimizer": o["optimizer"],
        "moe_routing": o["moe_routing"],
        "capacity_factor": o["capacity_factor"],
        "steps": o.get("steps", 2),
        "dp": o.get("dp", 1),
        "zero_stage": o.get("zero", 0),
        "offload_optimizer": o.get("offload_optimizer", False),
    }


def predict(spec: dict[str, Any], profile: EagerProfile) -> tuple[int, str]:
    """The estimator's allocator peak and phase for a reference run (no device overheads)."""
    model = ModelSpec.model_validate(spec["model"])
    moe = model.moe is not None
    imbalance = spec["capacity_factor"] if moe and spec["moe_routing"] == "capacity" else 1.0
    training = Training(
        micro_batch=spec["micro_batch"],
        seq_len=spec["seq_len"],
        recompute=spec["recompute"],
        flash_attention=True,
        dropout=False,
        precision=_PRECISION[spec["dtype"]],
        moe_imbalance=imbalance,
        implementation=profile,
        zero_stage=spec.get("zero_stage", 0),
        offload_optimizer=spec.get("offload_optimizer", False),
    )
    est = estimate(model, Layout(dp=spec.get("dp", 1)), training, _NO_OVERHEADS)
    return est.peak.bytes.allocated, est.peak_phase


def traced_prediction(request: dict[str, Any], profile: Any, sizes: Path | None) -> tuple[int, str]:
    """The estimator's allocator peak and phase for a ``--hf``/``--module`` step (no device
    overheads); a ``--module`` model's sizes come from ``sizes`` (``--module-config``)."""
    source, knobs = request["source"], request["knobs"]
    if source["kind"] == "hf":
        model = load_model(source["config"])
    elif sizes is not None:
        model = load_model(sizes)
    else:
        raise ConfigError(
            "--calibration",
            "predicting a --module step needs the model's sizes",
            "add --module-config CONFIG (a config.json of the model's sizes)",
        )
    training = Training(
        micro_batch=knobs["micro_batch"],
        seq_len=knobs["seq_len"],
        recompute="full" if knobs["checkpointing"] else "none",
        precision=_PRECISION[knobs["dtype"]],
        implementation=profile,
    )
    est = estimate(model, Layout(), training, _NO_OVERHEADS)
    return est.peak.bytes.allocated, est.peak_phase


def common_options(fn: Any) -> Any:
    options = [
        click.option(
            "--model",
            "-m",
            default=None,
            help="Preset name or config.json path: dssup's reference blocks of that size.",
        ),
        click.option("--layers", type=LAYERS, default=None, help="Override the layer count."),
        click.option(
            "--seq-len", type=TRACE_SEQ_LEN, default=128, show_default=True, help="Tokens/seq."
        ),
        click.option(
            "--dtype", type=Choice(["fp32", "bf16", "amp"]), default="fp32", show_default=True
        ),
        click.option(
            "--optimizer",
            type=Choice(["foreach", "fused", "forloop"]),
            default="foreach",
            show_default=True,
            help="AdamW implementation.",
        ),
        click.option(
            "--moe-routing",
            type=Choice(["capacity", "dropless"]),
            default="capacity",
            show_default=True,
        ),
        click.option(
            "--capacity-factor",
            type=Real(0.0, 1000.0, lo_open=True),
            default=1.25,
            show_default=True,
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


@main.command("measure")
@common_options
@source_options
@click.option("--micro-batch", "-b", type=BATCH, default=1, show_default=True)
@click.option(
    "--recompute",
    type=Choice(["none", "selective", "full"]),
    default="none",
    show_default=True,
)
@click.option(
    "--steps", type=Whole(1, 1000), default=2, show_default=True, help="Optimizer steps measured."
)
@click.option(
    "--dp", type=DEGREE, default=1, show_default=True, help="Data-parallel ranks (rank 0 measured)."
)
@click.option(
    "--zero", type=Whole(0, 2), default=0, show_default=True, help="ZeRO stage over --dp."
)
@click.option(
    "--offload-optimizer", is_flag=True, help="Optimizer states on the host (device peak shown)."
)
@click.option(
    "--mode",
    type=Choice(["real", "fake"]),
    default="real",
    show_default=True,
    help="real: CPU tensors, cross-checked with torch.profiler; fake: FakeTensorMode trace.",
)
@click.option(
    "--calibration",
    type=Existing("file"),
    default=None,
    help="Eager profile JSON from `dssup calibrate`: also print prediction and error.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def measure_cmd(mode: str, calibration: Path | None, as_json: bool, **o: Any) -> None:
    """Measure the allocator peak of real training steps on CPU (needs torch).

    \b
    Your own model code (one device, AdamW, cross-checked with torch.profiler):
      dssup measure --hf examples/custom_block/config.json --seq-len 256 -b 4 --attn eager
      dssup measure --hf examples/custom_block --recompute full -b 8   # transformers' checkpointing
      dssup measure --module custom_block.model:factory --module-path examples --seq-len 512 -b 2
    dssup's reference blocks sized from a preset or config:
      dssup measure --model openai-community/gpt2 --layers 2 --seq-len 256 -b 2
      dssup measure --model openai-community/gpt2 --layers 2 --seq-len 256 --dp 4 --zero 2
    A step that this machine's memory cannot hold is refused before it starts, with the figure:
      dssup measure --model deepseek-v3 --seq-len 4096 -b 8   # exit 2 (10 TiB of states alone)

    \b
    --recompute full checkpoints every repeated block (transformers' own
    activation_checkpointing_enable for --hf). --dp/--zero/--offload-optimizer (reference blocks
    only) measure rank 0 of a data-parallel job in one process (torch's fake process group; an
    offloaded optimizer sits on the meta device, only the device peak is reported).
    """
    source = traced_source(o)
    unchecked = _check_memory(o, source) if mode == "real" else None
    if source is not None:
        request: dict[str, Any] = {"source": source, "knobs": traced_knobs(o)}
        profile = None if calibration is None else _cpu_profile(calibration)
        out = run_child(TRACED, f"measure-{mode}", request)
        if profile is not None:
            sizes = o.get("module_config")
            _predict_into(out, traced_prediction(request, profile, sizes))
    else:
        spec = reference_spec(o)
        out = run_child(REFERENCE, f"measure-{mode}", spec)
        if calibration is not None:
            _predict_into(out, predict(spec, _profile(calibration)))
    if as_json:
        if unchecked:
            out["note"] = unchecked
        click.echo(json.dumps(out, separators=(",", ":")))
        return
    click.echo(render_measurement(out, mode))
    if unchecked:  # after the run: a refusal of the input stays one line
        click.echo(f"note: {unchecked}")


def _step_model(o: dict[str, Any], source: dict[str, Any] | None) -> ModelSpec | None:
    """The model the measured step builds, as the memory model reads it (None: not known)."""
    if source is None:
        return ModelSpec.model_validate(reference_spec(o)["model"])
    if source["kind"] == "hf":
        return load_model(source["config"])
    return load_model(o["module_config"]) if o.get("module_config") else None


def _check_memory(o: dict[str, Any], source: dict[str, Any] | None) -> str | None:
    """Refuse a real step that cannot fit in this machine's memory, before it starts; the note
    to print after the run when it could not be checked."""
    model = _step_model(o, source)
    if model is None:
        return "memory not checked before the run (--module states no sizes; --module-config does)"
    training = Training(
        micro_batch=o.get("micro_batch", 1), seq_len=o["seq_len"], framework="transformers",
        attention="sdpa-cpu", precision=_PRECISION[o["dtype"]], recompute=o.get("recompute", "none"),
        zero_stage=o.get("zero", 0), offload_optimizer=o.get("offload_optimizer", False),
    )  # fmt: skip
    try:
        est = estimate(model, Layout(dp=o.get("dp", 1)), training, _NO_OVERHEADS)
    except ConfigError:
        return None  # the child reports what it cannot run, in its own words
    need = int(est.peak.bytes.allocated * SAFETY) + PROCESS_BYTES
    free, where = available_bytes()
    if free is not None and need > free:
        raise ConfigError(
            "host memory",
            f"the step needs about {need / 2**30:.1f} GiB (the memory model's "
            f"{est.peak.bytes.allocated / 2**30:.1f} GiB peak x {SAFETY} + "
            f"{PROCESS_BYTES >> 30} GiB for the process) and this machine has "
            f"{free / 2**30:.1f} GiB ({where})",
            "use fewer --layers, a shorter --seq-len, a smaller -b, or --mode fake (nothing "
            "allocated)",
        )
    return None


def _profile(path: Path) -> Any:
    return load_profile(path)


def _cpu_profile(path: Path) -> Any:
    """A traced profile to check against this CPU's steps: traced with the CPU's kernels."""
    profile = load_profile(path)
    knobs = profile.provenance.knobs if isinstance(profile, TracedProfile) else {}
    if knobs.get("kernels") == "cuda" and knobs.get("attention_kernels"):
        raise ConfigError(
            "--calibration",
            f"{path} was traced with CUDA's attention kernels (what a GPU keeps); this CPU runs "
            "its own, so the check would compare different kernels",
            "calibrate again with --kernels cpu for a check on this CPU",
        )
    return profile


def _predict_into(out: dict[str, Any], predicted: tuple[int, str]) -> None:
    out["predicted_bytes"], out["predicted_phase"] = predicted
    out["error"] = (out["predicted_bytes"] - out["peak_bytes"]) / out["peak_bytes"]


def render_measurement(out: dict[str, Any], mode: str) -> str:
    """The text report of one measurement (and its prediction)."""
    mib = 1 << 20
    lines = [
        f"peak {out['peak_bytes'] / mib:.2f} MiB in {out['phase']} (step {out['step']}), "
        f"{mode}, {out['seconds']:.1f} s"
    ]
    if out.get("found"):
        lines.append(f"  model: {out['found']}; {out['parameters']:,} parameters")
    lines += [
        f"  {key:<11} {value / mib:10.2f} MiB"
        for key, value in out["breakdown"].items()
        if key != "Total"
    ]
    if out.get("profiler_peak_bytes") is not None:
        lines.append(f"  torch.profiler agrees: {out['profiler_peak_bytes'] / mib:.2f} MiB")
    for label, count, size in out.get("top_tensors", [])[:8]:
        lines.append(f"  {size / mib:10.2f} MiB  {count:4d} x {label}")
    if "predicted_bytes" in out:
        lines.append(
            f"predicted {out['predicted_bytes'] / mib:.2f} MiB ({out['predicted_phase']}), "
            f"error {out['error']:+.2%}"
        )
    return "\n".join(lines)
