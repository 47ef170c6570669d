"""Feed the ``InMemoryCache`` from the Kubernetes API: list once, then watch, per resource.

One daemon thread per resource (GPU Nodes, as NVIDIA GPU Feature Discovery or AMD's ROCm node
labeller label them: one label-selected watch each; labelled ConfigMaps; Cluster/
TrainingRuntimes) runs list -> watch -> (410 Gone or error) -> relist, with exponential backoff
(tenacity) between failures. The cache reports ``synced`` once every resource has been listed
(a missing CRD counts as listed and empty), and readiness waits for that. Requests never call
the API: a miss is answered from what the watch has seen.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tenacity import Retrying, retry_if_exception_type, stop_never, wait_exponential

from dssup.admission.cache import InMemoryCache
from dssup.admission.nodegpu import AMD_PRODUCT_LABEL, GPU_PRODUCT_LABEL

__all__ = ["KubeWatchCache", "Resource"]

log = logging.getLogger(__name__)
TRAINER = ("trainer.kubeflow.org", "v1alpha1")


@dataclass(frozen=True)
class Resource:
    """A list function of the kubernetes client and the kind its items have."""

    kind: str
    list_fn: Callable[..., Any]
    kwargs: dict[str, Any]

    @property
    def key(self) -> str:
        """The kind, and the namespace of a namespaced list or the label of a Node list."""
        ns = self.kwargs.get("namespace")
        if ns:
            return f"{self.kind}/{ns}"
        return f"{self.kind}[{self.node_label}]" if self.node_label else self.kind

    @property
    def node_label(self) -> str | None:
        """The label key a Node list selects on (its LIST replaces only Nodes carrying it)."""
        return self.kwargs.get("label_selector") if self.kind == "Node" else None


class _Relist(Exception):
    """The watch expired (HTTP 410) or ended with an error: list again."""


class KubeWatchCache:
    """List+watch loops feeding ``store``; ``synced()`` once everything was listed once."""

    def __init__(
        self,
        store: InMemoryCache,
        api: client.ApiClient,
        *,
        config_map_selector: str = "dssup.io/watch=true",
        config_map_namespaces: tuple[str, ...] = (),
        watch_timeout_s: int = 300,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.store = store
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        selector = {"label_selector": config_map_selector} if config_map_selector else {}
        # ConfigMaps: per opted-in namespace (a Role there grants list/watch: least privilege),
        # or cluster-wide when no namespace is named (needs a ClusterRole rule on configmaps).
        config_maps = (
            [
                Resource(
                    "ConfigMap",
                    core.list_namespaced_config_map,
                    {"namespace": ns, **selector},
                )
                for ns in config_map_namespaces
            ]
            if config_map_namespaces
            else [Resource("ConfigMap", core.list_config_map_for_all_namespaces, selector)]
        )
        self.resources = [
            *(
                Resource("Node", core.list_node, {"label_selector": label})
                for label in (GPU_PRODUCT_LABEL, AMD_PRODUCT_LABEL)
            ),
            *config_maps,
            Resource(
                "ClusterTrainingRuntime",
                custom.list_cluster_custom_object,
                {"group": TRAINER[0], "version": TRAINER[1], "plural": "clustertrainingruntimes"},
            ),
            Resource(
                "TrainingRuntime",
                custom.list_cluster_custom_object,
                {"group": TRAINER[0], "version": TRAINER[1], "plural": "trainingruntimes"},
            ),
        ]
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads: list[threading.Thread] = []
        self._api = api

    def synced(self) -> bool:
        return len(self._listed) == len(self.resources)

    def start(self) -> None:
        for res in self.resources:
            t = threading.Thread(
                target=self._run, args=(res,), name=f"dssup-watch-{res.key}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()  # type: ignore[no-untyped-call]
        for t in self._threads:
            t.join(timeout)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _run(self, res: Resource) -> None:
        retrying = Retrying(
            stop=stop_never,
            wait=wait_exponential(multiplier=0.5, max=self.max_backoff_s),
            retry=retry_if_exception_type(Exception),
            reraise=False,
            sleep=self._sleep,
        )
        for attempt in retrying:
            if self._stop.is_set():
                return
            with attempt:
                self._list_and_watch(res)

    def _list(self, res: Resource) -> str:
        try:
            resp = res.list_fn(**res.kwargs, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:  # the CRD is not installed: nothing to cache
                self.store.replace_all(res.kind, [], res.kwargs.get("namespace"), res.node_label)
                self._mark(res)
                self._stop.wait(300)
                raise _Relist(f"{res.kind}: not served") from None
            raise
        doc = json.loads(resp.data)
        items = list(doc.get("items") or [])
        self.store.replace_all(res.kind, items, res.kwargs.get("namespace"), res.node_label)
        self._mark(res)
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _mark(self, res: Resource) -> None:
        if res.key not in self._listed:
            self._listed.add(res.key)
            log.info("cache of %s synced", res.key)
        if self.synced():
            self.store.mark_synced()

    def _events(self, res: Resource, rv: str) -> Iterator[dict[str, Any]]:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watches.append(w)
        try:
            yield from w.stream(  # type: ignore[no-untyped-call]
                res.list_fn,
                **res.kwargs,
                resource_version=rv,
                timeout_seconds=self.watch_timeout_s,
                allow_watch_bookmarks=True,
            )
        finally:
            self._watches.remove(w)

    def _list_and_watch(self, res: Resource) -> None:
        rv = self._list(res)
        while not self._stop.is_set():
            for event in self._events(res, rv):
                obj = event.get("raw_object") or {}
                meta = obj.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED"):
                    self.store.upsert({**obj, "kind": res.kind})
                elif kind == "DELETED":
                    self.store.delete(
                        res.kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")
                    )
                if self._stop.is_set():
                    return
