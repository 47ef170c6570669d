"""``dssup webhook serve``: the admission webhook (HTTPS) plus health and metrics (HTTP).

Cluster knowledge comes from list+watch caches of Nodes, ConfigMaps and training runtimes
(in-cluster config, else kubeconfig), or from ``--cluster-file`` (a YAML snapshot; for demos and
for running without an API server). SIGTERM drains: not ready first, then stop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import click
import yaml

from dssup.admission.adapter import Adapter
from dssup.admission.cache import InMemoryCache
from dssup.admission.offline import load_documents
from dssup.admission.policy import Policy
from dssup.admission.server import ServeOptions, WebhookServer
from dssup.admission.settings import PolicySettings
from dssup.cli.admit import policy_options, policy_settings
from dssup.cli.app import main
from dssup.cli.values import PORT, Existing, Real, Size
from dssup.errors import ConfigError
from dssup.memory.gpus import parse_bytes
from dssup.obs.metrics import PrometheusMetrics

__all__ = ["webhook"]

log = logging.getLogger("dssup.cli.webhook")


@main.group("webhook")
def webhook() -> None:
    """Kubernetes admission webhook that resizes or rejects jobs by predicted GPU memory."""


def _settings(o: dict[str, Any], config: Path | None, ctx: click.Context) -> PolicySettings:
    flags = policy_settings(o)
    if not config:
        return flags
    try:
        data = yaml.safe_load(Path(config).read_text()) or {}
        base = PolicySettings(**data)
    except (OSError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise ConfigError(
            "--config",
            f"cannot use {config}: {exc}".splitlines()[0],
            "give a YAML mapping of policy settings (see docs/admission.md)",
        ) from None
    names = {
        "reserve": "reserve_bytes",
        "plan_margin": "plan_margin",
        "default_gpu": "default_gpu_product",
        "no_recompute_resize": "allow_recompute",
        "no_zero_resize": "allow_zero",
        "allow_offload": "allow_offload",
    }
    given = {
        names[k]: getattr(flags, names[k])
        for k in names
        if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE
    }
    return base.model_copy(update=given)


def _cache(
    cluster_file: Path | None, kubeconfig: Path | None, selector: str, namespaces: tuple[str, ...]
) -> tuple[InMemoryCache, Any]:
    if cluster_file:
        store = InMemoryCache()
        try:
            docs = load_documents([Path(cluster_file).read_text(encoding="utf-8")])
        except ConfigError as exc:  # load_documents names -f, the admit command's flag
            raise ConfigError("--cluster-file", exc.problem, exc.fix) from None
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise ConfigError(
                "--cluster-file",
                f"cannot use {cluster_file}: {exc}".splitlines()[0][:300],
                "give a YAML snapshot of Nodes, ConfigMaps and runtimes",
            ) from None
        for doc in docs:
            store.upsert(doc)
        return store, None
    from kubernetes import config as kconfig
    from kubernetes.client import ApiClient

    from dssup.admission.kube_cache import KubeWatchCache

    try:
        if kubeconfig:
            kconfig.load_kube_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        else:
            kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
    except (kconfig.ConfigException, OSError) as exc:
        raise ConfigError(
            "--kubeconfig",
            f"no Kubernetes credentials: {exc}",
            "run in a pod, pass --kubeconfig, or use --cluster-file",
        ) from None
    store = InMemoryCache(synced=False)
    watcher = KubeWatchCache(
        store, ApiClient(), config_map_selector=selector, config_map_namespaces=namespaces
    )
    watcher.start()
    return store, watcher


async def _serve(server: WebhookServer) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    await server.run()


@webhook.command("serve")
@click.option(
    "--cert-file",
    required=True,
    type=Existing("file"),
    help="PEM certificate chain; reloaded in place when the file changes.",
)
@click.option("--key-file", required=True, type=Existing("file"), help="PEM key.")
@click.option("--host", default="0.0.0.0", show_default=True, help="Listen address.")  # noqa: S104
@click.option(
    "--port",
    type=PORT,
    default=9443,
    show_default=True,
    help="HTTPS port (/mutate /validate /warn).",
)
@click.option(
    "--health-port",
    type=PORT,
    default=8081,
    show_default=True,
    help="Plain HTTP port (/healthz /readyz /metrics).",
)
@click.option(
    "--max-body",
    type=Size("bytes"),
    default="8MiB",
    show_default=True,
    help="Largest request body (413 past it).",
)
@click.option(
    "--drain",
    type=Real(0.0, 3600.0),
    default=3.0,
    show_default=True,
    help="Seconds not-ready before stopping on SIGTERM.",
)
@click.option(
    "--read-timeout",
    type=Real(0.0, 3600.0, lo_open=True),
    default=10.0,
    show_default=True,
    help="Seconds a request's headers may take from its first byte, and its body after them.",
)
@click.option(
    "--judge-deadline",
    type=Real(0.0, 3600.0, lo_open=True),
    default=1.0,
    show_default=True,
    help="Seconds after which a large review is allowed unjudged, with a warning.",
)
@click.option(
    "--config",
    "config",
    type=Existing("file"),
    default=None,
    help="YAML of policy settings (flags given on the command line win).",
)
@click.option(
    "--cluster-file",
    type=Existing("file"),
    default=None,
    help="Serve from a YAML snapshot of Nodes/ConfigMaps/runtimes instead of watching the API.",
)
@click.option(
    "--kubeconfig",
    type=Existing("file"),
    default=None,
    help="Kubeconfig (default: in-cluster service account).",
)
@click.option(
    "--configmap-selector",
    default="dssup.io/watch=true",
    show_default=True,
    help="Label selector of the ConfigMaps to cache (model configs, DeepSpeed JSON).",
)
@click.option(
    "--configmap-namespaces",
    default="",
    help="Comma-separated namespaces whose ConfigMaps are watched (each needs the Role of "
    "examples/k8s/dssup-configmap-reader.yaml). Empty: all namespaces (needs a ClusterRole).",
)
@policy_options
@click.pass_context
def serve(
    ctx: click.Context,
    /,
    cert_file: Path,
    key_file: Path,
    host: str,
    port: int,
    health_port: int,
    max_body: str,
    drain: float,
    read_timeout: float,
    judge_deadline: float,
    config: Path | None,
    cluster_file: Path | None,
    kubeconfig: Path | None,
    configmap_selector: str,
    configmap_namespaces: str,
    **o: Any,
) -> None:
    """Serve the admission webhook until SIGTERM."""
    import uvloop

    settings = _settings(o, config, ctx)
    opts = ServeOptions(
        cert_file=str(cert_file),
        key_file=str(key_file),
        host=host,
        port=port,
        health_port=health_port,
        max_body_bytes=parse_bytes(max_body, "--max-body"),
        drain_s=drain,
        header_timeout_s=read_timeout,
        body_timeout_s=read_timeout,
        judge_deadline_s=judge_deadline,
    )
    namespaces = tuple(n.strip() for n in configmap_namespaces.split(",") if n.strip())
    store, watcher = _cache(cluster_file, kubeconfig, configmap_selector, namespaces)
    metrics = PrometheusMetrics()
    policy = Policy(store, settings)
    metrics.track_caches(policy.cache_stats)
    server = WebhookServer(opts, Adapter(policy, metrics), store, metrics)
    log.info(
        "serving https on %s:%d, health on %d",
        host,
        port,
        health_port,
        extra={"reserve_bytes": settings.reserve_bytes},
    )
    try:
        uvloop.run(_serve(server))
    finally:
        if watcher is not None:
            watcher.stop()
