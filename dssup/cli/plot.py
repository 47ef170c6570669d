"""PNG chart of an estimate: one stacked bar per pipeline stage, with the GPU capacity line.

matplotlib is imported here only, with the Agg backend, so the rest of the CLI starts fast and
no display is ever needed.
"""

from __future__ import annotations

from pathlib import Path

from dssup.errors import ConfigError
from dssup.memory import Estimate

__all__ = ["plot_estimate"]

_PARTS = (
    ("weights", "weights", "#4C72B0"),
    ("gradients", "gradients", "#55A868"),
    ("optimizer", "optimizer", "#C44E52"),
    ("activations", "activations", "#8172B2"),
    ("buffers", "buffers + ZeRO-3 set", "#CCB974"),
    ("fragmentation", "fragmentation", "#64B5CD"),
    ("cuda_context", "CUDA context", "#8C8C8C"),
)


def _values(est: Estimate, key: str) -> list[float]:
    g = float(1 << 30)
    out = []
    for st in est.stages:
        b = st.bytes
        v = getattr(b, key)
        if key == "buffers":
            v = b.buffers + b.zero3_working_set + b.calibration
        out.append(v / g)
    return out


def _layout(est: Estimate) -> str:
    """The config in one line: model, layout, batch, recompute, ZeRO."""
    fw = est.framework if est.framework and est.framework != est.convention else None
    head = f"{est.model} (convention {est.convention}{', framework ' + fw if fw else ''})"
    i = est.inputs
    if i is None:
        return head
    lay = i.layout
    parts = [f"TP {lay.tp}", f"PP {lay.pp}"] + [
        f"{k} {v}" for k, v in (("VPP", lay.vpp), ("EP", lay.ep), ("CP", lay.cp)) if v > 1
    ]
    parts += [
        f"DP {lay.dp}",
        f"micro-batch {i.micro_batch} x accum {i.grad_accum} (global {i.global_batch})",
        f"seq {i.seq_len}",
        f"recompute {i.recompute}",
        f"ZeRO-{i.zero_stage}",
    ]
    if i.offload != "none":
        parts.append(f"offload {i.offload}")
    return f"{head}: {', '.join(parts)}"


def _verdict(est: Estimate) -> str:
    g = float(1 << 30)
    peak = f"peak {est.peak_bytes / g:.1f} GiB on stage {est.peak_stage} ({est.peak_phase})"
    if est.gpu_memory_bytes is None:
        return f"{peak}; no GPU to check against"
    fits = "FITS" if est.headroom_bytes is not None and est.headroom_bytes >= 0 else "DOES NOT FIT"
    line = f"{peak}: {fits} the GPU's {est.gpu_memory_bytes / g:.1f} GiB"
    if est.host_fits is False:
        line += "; DOES NOT FIT the host"
    return line + (" (near the limit)" if est.near_limit else "")


def plot_estimate(est: Estimate, path: Path) -> Path:
    """Write the chart to ``path`` (PNG) atomically and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [str(st.stage) for st in est.stages]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(stages) + 3), 4.5), dpi=120)
    bottom = [0.0] * len(stages)
    for key, label, color in _PARTS:
        vals = _values(est, key)
        ax.bar(stages, vals, bottom=bottom, label=label, color=color, width=0.7)
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    if est.gpu_memory_bytes:
        cap = est.gpu_memory_bytes / float(1 << 30)
        ax.axhline(cap, color="black", linestyle="--", linewidth=1.2, label=f"GPU {cap:.0f} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"{_layout(est)}\n{_verdict(est)}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, format="png")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            "--plot",
            f"cannot write {path} ({exc.strerror})",
            "give a file in a folder you can write",
        ) from None
    finally:
        plt.close(fig)
    return path
