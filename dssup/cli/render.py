"""Human-readable tables for estimates and plans (the JSON form is the model's own dump)."""

from __future__ import annotations

from collections.abc import Sequence

from dssup.memory import Estimate
from dssup.memory.capacity import Band, near_words
from dssup.memory.offload import HOST_TERMS

__all__ = ["gib", "render_estimate", "table"]


def gib(n: int | float) -> str:
    return f"{n / (1 << 30):.2f}"


_COLS = (
    "stage",
    "layers",
    "params(B)",
    "weights",
    "grads",
    "optim",
    "activ",
    "x mb",
    "zero3",
    "buffers",
    "frag",
    "ctx",
    "TOTAL",
    "host",
)


def _span(layers: list[int]) -> str:
    return f"{layers[0]}-{layers[-1]}" if layers else "-"


def _multi(est: Estimate) -> bool:
    """Some device holds more than one stage (DualPipe, interleaved): show which."""
    return any(len(st.held) > 1 for st in est.stages)


def _stage_rows(est: Estimate) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    multi, extra = _multi(est), est.convention != "paper"
    for st in est.stages:
        b = st.bytes
        layers = _span(st.layers)
        mark = "*" if st.stage == est.peak_stage else ""
        in_flight = f"{b.in_flight_micro_batches}"
        head: tuple[str, ...] = (f"{st.stage}{mark}", layers)
        if multi:
            layers = ",".join(_span(h.layers) for h in st.held)
            in_flight = "+".join(str(h.in_flight_micro_batches) for h in st.held)
            head = (f"{st.stage}{mark}", "+".join(str(h.stage) for h in st.held), layers)
        work = (gib(b.backward_working_set + b.activation_constant),) if extra else ()
        rows.append(
            (
                *head,
                f"{st.params.total / 1e9:.2f}",
                gib(b.weights),
                gib(b.gradients),
                gib(b.optimizer),
                gib(b.activations),
                in_flight,
                *work,
                gib(b.zero3_working_set),
                gib(b.buffers),
                gib(b.fragmentation),
                gib(b.cuda_context),
                gib(b.total),
                gib(st.host_bytes),
            )
        )
    return rows


def _columns(est: Estimate) -> tuple[str, ...]:
    cols: tuple[str, ...] = _COLS
    if est.convention != "paper":  # the backward working set (and autocast's copies)
        cols = (*cols[:8], "bwd", *cols[8:])
    if _multi(est):
        cols = ("device", "stages", *cols[1:])
    return cols


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def render_estimate(est: Estimate, verbose: bool = False) -> str:
    """Per-stage table in GiB, the peak, the verdict and the assumptions."""
    lines = [
        f"{est.model}: per-GPU memory, {est.world_size} GPUs, convention {est.convention} (GiB)"
    ]
    lines += table(_columns(est), _stage_rows(est))
    peak = est.peak
    lines.append(
        f"peak: stage {est.peak_stage} {gib(est.peak_bytes)} GiB in the {est.peak_phase} phase "
        f"({gib(peak.bytes.activations_per_micro_batch)} GiB activations per micro-batch)"
    )
    if est.gpu_memory_bytes is not None and est.headroom_bytes is not None:
        verdict = "FITS" if est.headroom_bytes >= 0 else "DOES NOT FIT"
        line = f"GPU {gib(est.gpu_memory_bytes)} GiB: {verdict} (headroom {gib(est.headroom_bytes)} GiB)"
        if est.near_limit:
            line += ", " + near_words(Band(est.uncertainty or 0.0, est.uncertainty_source))
        lines.append(line)
    lines += _host_lines(est)
    if verbose:
        lines.append("activation terms of the peak stage (per micro-batch, GiB):")
        for name, nbytes in sorted(peak.activation_terms.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<28} {gib(nbytes)}")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in est.assumptions]
    return "\n".join(lines)


def _host_lines(est: Estimate) -> list[str]:
    """Host memory per GPU and per node, and the host verdict when a limit was given."""
    peak = max(est.stages, key=lambda s: max(s.host_bytes, s.host_init_bytes))
    if est.host_bytes_per_node is None or not (peak.host_bytes or peak.host_init_bytes):
        return []
    per_gpu = f"{gib(peak.host_bytes)} GiB per GPU in training"
    if peak.host_init_bytes:
        per_gpu += f", {gib(peak.host_init_bytes)} GiB while the model is built"
    line = (
        f"host: {per_gpu}; {gib(est.host_bytes_per_node)} GiB per node of {est.gpus_per_node} GPUs"
    )
    if est.host_memory_bytes is not None and est.host_headroom_bytes is not None:
        verdict = "FITS" if est.host_fits else "DOES NOT FIT"
        line += (
            f"; host {gib(est.host_memory_bytes)} GiB: {verdict} "
            f"(headroom {gib(est.host_headroom_bytes)} GiB)"
        )
    n = est.gpus_per_node or 1
    parts = [(HOST_TERMS.get(k, k), v * n) for k, v in peak.host_terms.items()]
    if peak.host_init_bytes > peak.host_bytes:  # the build, not training, sets the need
        parts = [("model build before partitioning", peak.host_init_bytes * n)]
    terms = ", ".join(f"{name} {gib(v)}" for name, v in sorted(parts, key=lambda x: -x[1]))
    return [line, f"host per node by term (GiB): {terms}"] if terms else [line]
