"""How much memory this machine can give a new process now, and whether a measured step fits.

``dssup measure`` runs real training steps on the CPU: a step that needs more than the machine
has fails after minutes (the help's own example once needed 14 GiB and ended with exit 125
after 86 s). So the step's need is predicted first, by the memory model itself (the
transformers formula with the CPU's SDPA, the measured dtype, no device overheads), plus what
a process with torch and the profiler takes, and compared with what is available: the
kernel's ``MemAvailable``, bounded by this process's cgroup limit (v2 ``memory.max`` less
``memory.current``, or v1's ``limit_in_bytes`` less ``usage_in_bytes``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PROCESS_BYTES", "SAFETY", "available_bytes"]

PROCESS_BYTES = 1 << 30  # torch, the profiler's event buffers, the interpreter
SAFETY = 1.25  # the prediction is of allocator bytes; the heap and the profiler add to them


def _meminfo() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """The room left under this process's cgroup memory limit, if there is one."""
    try:
        rel = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in rel:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit, used = base / "memory.max", base / "memory.current"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit, used = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        try:
            raw = limit.read_text().strip()
            if raw == "max" or int(raw) >= 1 << 60:
                return None
            return int(raw) - int(used.read_text().strip())
        except (OSError, ValueError):
            return None
    return None


def available_bytes() -> tuple[int | None, str]:
    """(bytes a new process can use now, where the figure comes from); None when unknown."""
    free, room = _meminfo(), _cgroup_room()
    if free is None and room is None:
        return None, "unknown (no /proc/meminfo)"
    if room is not None and (free is None or room < free):
        return room, "the cgroup memory limit less its usage"
    return free, "MemAvailable"
