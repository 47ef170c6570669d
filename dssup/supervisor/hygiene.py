"""Between attempts: proof that the old workers and their memory are gone, and OOM-kill counters.

Relaunching while a failed worker still holds GPU memory makes the next attempt OOM for a reason
that has nothing to do with its plan. So dssup waits until no process of the attempt survives
(``process.wait_gone``) and, where NVML is available (``nvidia-ml-py``, the ``gpu`` extra), until
none of the attempt's PIDs holds a GPU context. The kernel OOM killer leaves no error file;
its evidence is the ``oom_kill`` counter of the memory cgroup, read for our whole subtree
(cgroup v1 ``memory.oom_control``, v2 ``memory.events``) before and after each attempt.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["oom_kill_count", "wait_gpu_released"]

log = logging.getLogger(__name__)
_V1_ROOT = Path("/sys/fs/cgroup/memory")
_V2_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup() -> tuple[Path, str] | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _V1_ROOT / path.lstrip("/"), "v1"
    for line in lines:
        if line.startswith("0::"):
            return _V2_ROOT / line[3:].lstrip("/"), "v2"
    return None


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0


def oom_kill_count(base: Path | None = None, version: str | None = None) -> int:
    """OOM kills so far in our memory cgroup and every cgroup below it."""
    found = (base, version or "v1") if base is not None else _own_cgroup()
    if found is None:
        return 0
    root, ver = found
    if ver == "v2":
        return _counter(root / "memory.events", "oom_kill")
    total = 0
    for dirpath, _, files in os.walk(root):
        if "memory.oom_control" in files:
            total += _counter(Path(dirpath) / "memory.oom_control", "oom_kill")
    return total


def wait_gpu_released(pids: Iterable[int], timeout: float = 30.0) -> bool:
    """True once no listed PID holds a GPU context (or NVML is not available)."""
    try:
        import pynvml
    except ImportError:
        return True
    wanted = set(pids)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    try:
        deadline = time.monotonic() + timeout
        while True:
            holding = set()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    holding.add(p.pid)
            if not (holding & wanted):
                return True
            if time.monotonic() > deadline:
                log.warning("GPU memory still held by %s after %.0f s", holding & wanted, timeout)
                return False
            time.sleep(0.1)
    finally:
        pynvml.nvmlShutdown()
