"""The one table of failure signatures: every message pattern dssup recognises, in one place.

Order matters: the first matching row wins, so specific rows (an OOM *inside* a collective, a
cascade that merely reports another rank's death) come before general ones. Each row was
checked against a real captured message (``tests/fixtures/supervisor/messages/``); the tests
walk the fixtures and this table together. Message patterns are only one source: ``classify``
combines them with exit codes, signals, error files and cgroup counters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dssup.supervisor.models import FailureKind

__all__ = ["SIGNATURES", "Signature", "match", "parse_bytes", "parse_oom_numbers"]


@dataclass(frozen=True)
class Signature:
    name: str
    kind: FailureKind
    pattern: re.Pattern[str]
    cascade: bool = False
    # The message alone means the process is ending (Python's own "can't open file", an
    # argparse usage error, a Rust allocation abort): no traceback needed to stop the attempt.
    fatal: bool = False


def _sig(
    name: str, kind: FailureKind, regex: str, cascade: bool = False, fatal: bool = False
) -> Signature:
    return Signature(name, kind, re.compile(regex, re.IGNORECASE | re.MULTILINE), cascade, fatal)


K = FailureKind
SIGNATURES: tuple[Signature, ...] = (
    # --- OOM inside communication: a batch cut barely helps (buffers, not activations)
    _sig("nccl-cuda-oom", K.COMM_OOM, r"NCCL.*(Cuda failure|cuda error).*out of memory"),
    # a C++ allocation failure: a collective's buffers when the traceback is inside one;
    # classify makes it host-oom when the traceback shows another phase (a save, a load)
    _sig("comm-bad-alloc", K.COMM_OOM, r"MemoryError: std::bad_alloc"),
    # --- device OOM
    _sig("cuda-oom", K.CUDA_OOM, r"CUDA out of memory\. Tried to allocate"),
    _sig("torch-oom-error", K.CUDA_OOM, r"\bOutOfMemoryError\b"),
    _sig("cuda-error-oom", K.CUDA_OOM, r"CUDA error: out of memory"),
    _sig("cublas-alloc", K.CUDA_OOM, r"CUBLAS_STATUS_ALLOC_FAILED"),
    _sig("xpu-oom", K.CUDA_OOM, r"\b(XPU|HIP|MPS) (backend )?out of memory"),
    _sig("cudnn-not-supported", K.CUDA_OOM, r"CUDNN_STATUS_NOT_SUPPORTED"),
    _sig("cpu-allocator", K.HOST_OOM, r"DefaultCPUAllocator: can't allocate memory"),
    _sig("python-memoryerror", K.HOST_OOM, r"^\s*(\[rank\d+\]:\s*)?MemoryError\b"),
    # host allocations outside torch: numpy, a Rust writer (safetensors) aborting, the kernel
    # refusing memory to a syscall (fork, mmap, a pickle buffer)
    _sig(
        "numpy-alloc", K.HOST_OOM, r"_ArrayMemoryError|Unable to allocate [\d.]+ \w+ for an array"
    ),
    _sig("rust-alloc", K.HOST_OOM, r"memory allocation of \d+ bytes failed", fatal=True),
    _sig("errno-enomem", K.HOST_OOM, r"\[Errno 12\] Cannot allocate memory|os error 12\b"),
    _sig("dataloader-killed", K.HOST_OOM, r"DataLoader worker \(pid \d+\) is killed by signal"),
    _sig("kernel-oom", K.HOST_OOM, r"(Out of memory: Killed process|Memory cgroup out of memory)"),
    # --- cascades: this rank died because another one did
    _sig("gloo-peer-closed", K.COMM, r"Connection closed by peer", cascade=True),
    _sig("gloo-conn-reset", K.COMM, r"Connection reset by peer", cascade=True),
    _sig("nccl-watchdog", K.COMM, r"Watchdog caught collective operation timeout", cascade=True),
    _sig("nccl-teardown", K.COMM, r"taking the entire process down", cascade=True),
    _sig("nccl-remote", K.COMM, r"NCCL (communicator was aborted|error: remote process)", True),
    _sig("store-gone", K.COMM, r"(TCPStore|Broken pipe|recvValue failed|Socket Timeout)", True),
    # --- user errors: deterministic, never retried
    _sig("missing-script", K.USER_ERROR, r"can't open file .*\[Errno \d+\]", fatal=True),
    _sig("missing-module", K.USER_ERROR, r"^\S*python[\d.]*: No module named ", fatal=True),
    _sig("syntax-error", K.USER_ERROR, r"\b(SyntaxError|IndentationError|TabError)\b", fatal=True),
    _sig("import-error", K.USER_ERROR, r"\b(ModuleNotFoundError|ImportError)\b"),
    _sig("file-not-found", K.USER_ERROR, r"\b(FileNotFoundError|IsADirectoryError)\b"),
    _sig("name-error", K.USER_ERROR, r"\b(NameError|AttributeError|TypeError|KeyError)\b"),
    _sig("shape-mismatch", K.USER_ERROR, r"(size mismatch|shape mismatch|shapes cannot be multi)"),
    _sig("state-dict", K.USER_ERROR, r"Error\(s\) in loading state_dict"),
    _sig(
        "hf-arguments",
        K.USER_ERROR,
        r"Some specified arguments are not used by the HfArgumentParser",
    ),
    _sig("value-error", K.USER_ERROR, r"\b(ValueError|AssertionError)\b"),
    _sig(
        "argparse",
        K.USER_ERROR,
        r"^\S+: error: (unrecognized arguments|the following arguments|argument )",
        fatal=True,
    ),
    # --- real communication failures (no other rank died first): transient-ish
    _sig("dist-backend", K.COMM, r"\bDistBackendError\b"),
    _sig("nccl-error", K.COMM, r"\bNCCL error\b"),
)

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "bytes": 1}
_SIZE = r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB|bytes)"
_TRIED = re.compile(r"(?:Tried|tried) to allocate " + _SIZE)
_TOTAL = re.compile(r"total capacity of " + _SIZE + r" of which " + _SIZE + r" is free")
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use")
_RESERVED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")


def parse_bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.lower()])


def match(text: str) -> Signature | None:
    """The first signature that matches ``text`` (a message or a stderr tail)."""
    for sig in SIGNATURES:
        if sig.pattern.search(text):
            return sig
    return None


def parse_oom_numbers(text: str) -> dict[str, int]:
    """Numbers in an OOM message: tried_to_allocate, total, free, in_use, reserved_unallocated."""
    out: dict[str, int] = {}
    if m := _TRIED.search(text):
        out["tried_to_allocate"] = parse_bytes(*m.groups())
    if m := _TOTAL.search(text):
        out["total_bytes"] = parse_bytes(m.group(1), m.group(2))
        out["free_bytes"] = parse_bytes(m.group(3), m.group(4))
    if m := _IN_USE.search(text):
        out["in_use_bytes"] = parse_bytes(*m.groups())
    if m := _RESERVED.search(text):
        out["reserved_unallocated"] = parse_bytes(*m.groups())
    return out
