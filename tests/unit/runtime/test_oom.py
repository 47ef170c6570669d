"""What the step guard treats as an OOM is what the supervisor classifies as one."""

from __future__ import annotations

import pytest
import torch

from dssup.runtime.oom import OOM_MESSAGES, is_oom, oom_text
from dssup.supervisor.signatures import match

# As the allocators word them (torch 2.x sources and captured messages).
EXAMPLES = [
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 33554432 bytes. Error code 12 (Cannot allocate memory)",
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "HIP out of memory. Tried to allocate 1.00 GiB",
    "XPU out of memory. Tried to allocate 1.00 GiB",
    "MPS backend out of memory (MPS allocated: 17.00 GB)",
]


def test_every_recognised_message_has_an_example():
    assert all(any(m in e for e in EXAMPLES) for m in OOM_MESSAGES)


@pytest.mark.parametrize("text", EXAMPLES)
def test_every_message_the_guard_recovers_is_an_oom_for_the_supervisor(text):
    assert is_oom(RuntimeError(text))
    sig = match(f"RuntimeError: {text}")
    assert sig is not None and sig.kind.is_oom, (text, sig)


def test_real_allocator_failure_is_an_oom():
    """A real CPU allocation failure (more than the address space can hold)."""
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 62, dtype=torch.uint8)
    assert is_oom(info.value)
    assert oom_text(info.value).startswith("RuntimeError: [enforce fail")


def test_types_and_non_oom_errors():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape '[-1, 7]' is invalid for input of size 10"))
    assert not is_oom(ValueError("out of memory"))  # a ValueError is never an allocator's
    assert not is_oom(RuntimeError("Connection closed by peer"))
