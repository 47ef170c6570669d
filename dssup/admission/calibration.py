"""``dssup.io/calibration: configmap:<name>/<key>``: a job's own traced profile, from a ConfigMap.

A team calibrates its model code once (``dssup calibrate --hf/--module``), stores the JSON in a
ConfigMap of the job's namespace (``kubectl create configmap my-model-profile
--from-file=profile.json``) and annotates its jobs; the webhook then judges them with the
profile instead of the convention's activation model. Resolved from the cluster cache like the
``dssup.io/model`` ConfigMap: a ConfigMap not (yet) in the cache makes the job ``Incomplete``
(allowed with a warning), a missing key or an unreadable profile is a ``ConfigError`` naming the
annotation. Parsed profiles are kept per content (a profile is tens of KiB of JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache

from dssup.admission import annotations as ann
from dssup.admission.cache import ClusterCache
from dssup.admission.config import Incomplete
from dssup.errors import ConfigError
from dssup.memory.profile import EagerProfile
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import profile_from_json

__all__ = ["CALIBRATION", "calibration"]

CALIBRATION = ann.PREFIX + "calibration"


@lru_cache(maxsize=64)
def _parse(text: str, where: str) -> EagerProfile | TracedProfile:
    try:
        doc = json.loads(text)
    except ValueError:
        raise ConfigError(
            CALIBRATION, f"{where} is not JSON", "store the file `dssup calibrate` wrote"
        ) from None
    return profile_from_json(doc, where, CALIBRATION)


def calibration(
    annotations: Mapping[str, str], namespace: str, cache: ClusterCache
) -> EagerProfile | TracedProfile | None:
    """The profile the job's ``dssup.io/calibration`` annotation names, or None without one."""
    value = (annotations.get(CALIBRATION) or "").strip()
    if not value:
        return None
    name, _, key = value.removeprefix("configmap:").partition("/")
    if not value.startswith("configmap:") or not name or not key:
        raise ConfigError(
            CALIBRATION, f"{value!r} is not configmap:<name>/<key>", "name the ConfigMap and key"
        )
    data = cache.config_map(namespace, name)
    if data is None:
        raise Incomplete([f"cache miss: ConfigMap {name} (calibration profile) not in the cache"])
    if key not in data:
        raise ConfigError(
            CALIBRATION, f"ConfigMap {name} has no key {key!r}", "use an existing key"
        )
    return _parse(data[key], f"ConfigMap {namespace}/{name} key {key}")
