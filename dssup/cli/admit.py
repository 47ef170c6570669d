"""``dssup admit -f job.yaml``: the admission policy offline, for CI and before ``kubectl apply``.

Exit status: 0 allowed (patched or not), 1 denied, 2 unusable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from dssup.admission.offline import AdmitResult, admit, load_documents
from dssup.admission.settings import PolicySettings
from dssup.cli.app import main
from dssup.cli.values import Choice, Existing, Real, Size
from dssup.errors import ConfigError
from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.memory.gpus import parse_size

__all__ = ["admit_cmd", "policy_options", "policy_settings"]


def policy_options(fn: Any) -> Any:
    """Flags shared by ``dssup admit`` and ``dssup webhook serve``."""
    for opt in reversed(
        [
            click.option(
                "--reserve",
                type=Size("buffer"),
                default="0",
                show_default=True,
                help="Memory kept free on every GPU on top of what the driver keeps (other "
                "tenants, headroom you want). Default none: a fit is judged against what CUDA "
                "can allocate; the CUDA context and NCCL buffers are in the prediction.",
            ),
            click.option(
                "--plan-margin",
                type=Real(0.0, 1.0, hi_open=True),
                default=DEFAULT_MARGIN,
                show_default=True,
                help="Fraction of usable memory a resized config must leave free. Default none: "
                "a config within the memory model's uncertainty of the limit is allowed with a "
                "warning naming it.",
            ),
            click.option(
                "--no-recompute-resize", is_flag=True, help="Never raise recompute when resizing."
            ),
            click.option(
                "--no-zero-resize", is_flag=True, help="Never raise the ZeRO stage when resizing."
            ),
            click.option(
                "--allow-offload", is_flag=True, help="Let a resize offload optimizer states."
            ),
            click.option(
                "--default-gpu",
                default=None,
                help="GFD product assumed when a GPU job names none (e.g. NVIDIA-H100-80GB-HBM3).",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


def policy_settings(o: dict[str, Any]) -> PolicySettings:
    reserve = parse_size(o["reserve"], "--reserve", gpu=False, zero=True)
    if not 0 <= o["plan_margin"] < 1:
        raise ConfigError("--plan-margin", f"{o['plan_margin']} is outside [0, 1)", "use e.g. 0.05")
    return PolicySettings(
        reserve_bytes=reserve,
        plan_margin=o["plan_margin"],
        allow_recompute=not o["no_recompute_resize"],
        allow_zero=not o["no_zero_resize"],
        allow_offload=o["allow_offload"],
        default_gpu_product=o["default_gpu"],
    )


def _text(result: AdmitResult) -> str:
    d = result.decision
    verdict = "ALLOWED" if d.allowed else "DENIED"
    lines = [f"{result.name}: {verdict} ({d.code})", f"  {d.message}"]
    lines += [f"  namespace mode: {result.namespace_mode}"]
    lines += [f"  warning: {w}" for w in d.warnings]
    lines += [f"  note: {n}" for n in result.notes]
    if d.patch:
        lines += ["", result.diff().rstrip()]
    bd = d.breakdown
    if bd:
        g, c = bd["gpu"], bd["config"]
        lines += [
            "",
            f"  GPU {g['product']}: {g['totalGiB']} GiB ({g['source']}), CUDA can allocate "
            f"{g['cudaGiB']} GiB, usable {g['usableGiB']} GiB",
            f"  config: TP={c['tp']} PP={c['pp']} EP={c['ep']} CP={c['cp']} DP={c['dp']} "
            f"mbs={c['microBatch']} accum={c['gradAccum']} global={c['globalBatch']} "
            f"seq={c['seqLength']} recompute={c['recompute']} ZeRO-{c['zeroStage']}",
            "  stage   total  weights  grads  optimizer  activations  (GiB)",
        ]
        for s in bd["stages"]:
            mark = " <- peak" if s["stage"] == bd["peakStage"] else ""
            lines.append(
                f"  {s['stage']:>5} {s['totalGiB']:>7} {s['weightsGiB']:>8} {s['gradientsGiB']:>6} "
                f"{s['optimizerGiB']:>10} {s['activationsGiB']:>12}{mark}"
            )
    return "\n".join(lines)


def _read(name: str, flag: str) -> str:
    """A manifest's text; ``ConfigError`` (exit 2) for unreadable or binary files."""
    try:
        if name != "-" and not Path(name).is_file():
            raise ConfigError(
                flag, f"{name[:200]!r} is not a file that exists", "pass a YAML manifest"
            )
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            flag, f"cannot read {name[:200]!r}: {why}", "pass a readable file"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{name} is not UTF-8 text", "pass a YAML manifest") from None
    if "\x00" in text:
        raise ConfigError(flag, f"{name} is a binary file", "pass a YAML manifest")
    return text


@main.command("admit")
@click.option(
    "-f",
    "--filename",
    "files",
    multiple=True,
    required=True,
    help="Job manifest(s); '-' reads stdin. Nodes/ConfigMaps/runtimes in it feed the cache.",
)
@click.option(
    "--cluster",
    "cluster",
    multiple=True,
    type=Existing("file"),
    help="YAML with Nodes (GFD labels), ConfigMaps and (Cluster)TrainingRuntimes.",
)
@click.option(
    "-n",
    "--namespace",
    default="default",
    show_default=True,
    help="Namespace for objects that name none.",
)
@click.option("--no-mutate", is_flag=True, help="Only validate: do not try to resize.")
@click.option(
    "--namespace-mode",
    type=Choice(["enforce", "warn", "off"]),
    default=None,
    help="Judge as in an enforcing namespace (resize, deny), a warning one (warnings only) or "
    "an excluded one. Default: what a Namespace in the input says, else enforce.",
)
@click.option(
    "--configmap-selector",
    default="dssup.io/watch=true",
    show_default=True,
    help="ConfigMaps the webhook watches; others in the input are not used (as in the server).",
)
@click.option("-o", "--output", type=Choice(["text", "json"]), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --output json.")
@policy_options
def admit_cmd(
    files: tuple[str, ...],
    cluster: tuple[str, ...],
    namespace: str,
    no_mutate: bool,
    namespace_mode: str | None,
    configmap_selector: str,
    output: str,
    as_json: bool,
    **o: Any,
) -> None:
    """Judge a job manifest like the admission webhook would.

    \b
    Example:
      dssup admit -f examples/k8s/pytorchjob-deepseek-v3.yaml --namespace-mode enforce
    \b
    Exit status: 0 allowed (patched or not), 1 denied, 2 unusable input.
    JSON (--output json): {"allowed", "code", "message", "warnings", "patch",
    "namespaceMode", "notes"} for one job, a list of those for several.
    """
    texts = [_read(f, "-f") for f in files] + [_read(c, "--cluster") for c in cluster]
    results = admit(
        load_documents(texts),
        namespace=namespace,
        mutate=not no_mutate,
        settings=policy_settings(o),
        namespace_mode=namespace_mode,  # type: ignore[arg-type]
        configmap_selector=configmap_selector,
    )
    if as_json or output == "json":
        docs = [r.to_json() for r in results]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        click.echo("\n\n".join(_text(r) for r in results))
    sys.exit(0 if all(r.decision.allowed for r in results) else 1)
