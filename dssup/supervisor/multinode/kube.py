"""Decisions made visible on Kubernetes: an Event and annotations on this node's pod.

Optional and fail-soft by design: outside a pod, without the ``kubernetes`` package, or without
RBAC permission (``create`` on events, ``patch`` on pods), publishing is switched off after one
warning and training goes on. Inside a Kubeflow PyTorchJob pod it needs ``POD_NAME`` and
``POD_NAMESPACE`` from the downward API (falling back to ``HOSTNAME`` and the service account's
namespace file). Tests point ``api_client`` at a loopback server standing in for kube-apiserver.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dssup.supervisor.text import clip

__all__ = ["EventPublisher"]

log = logging.getLogger(__name__)
_SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _in_cluster_client() -> Any:
    from kubernetes import client, config

    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class EventPublisher:
    def __init__(
        self,
        enabled: bool = True,
        api_client: Callable[[], Any] | None = None,
        pod: str | None = None,
        namespace: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.pod = pod or env.get("POD_NAME") or env.get("HOSTNAME", "")
        self.namespace = namespace or env.get("POD_NAMESPACE") or _namespace_file()
        in_pod = api_client is not None or "KUBERNETES_SERVICE_HOST" in env
        self.enabled = enabled and in_pod and bool(self.pod) and bool(self.namespace)
        self._factory = api_client or _in_cluster_client
        self._api: Any = None
        self.sent = 0

    def publish(self, reason: str, message: str, annotations: Mapping[str, str]) -> bool:
        """Best effort: True when both the Event and the annotations were accepted."""
        if not self.enabled:
            return False
        try:
            from kubernetes import client

            if self._api is None:
                self._api = client.CoreV1Api(self._factory())
            self._event(client, reason, message)
            patch = {"metadata": {"annotations": dict(annotations)}}
            self._api.patch_namespaced_pod(self.pod, self.namespace, patch)
        except Exception as exc:  # any failure: RBAC, network, missing package
            log.warning(
                "Kubernetes publishing switched off: %s", clip(str(exc).splitlines()[0], 200)
            )
            self.enabled = False
            return False
        self.sent += 1
        return True

    def _event(self, client: Any, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{self.pod}.dssup-"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=self.pod, namespace=self.namespace, api_version="v1"
            ),
            reason=reason,
            message=clip(message, 1024),
            type="Normal",
            source=client.V1EventSource(component="dssup"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._api.create_namespaced_event(self.namespace, event)


def _namespace_file() -> str:
    try:
        return (_SA / "namespace").read_text().strip()
    except OSError:
        return ""
