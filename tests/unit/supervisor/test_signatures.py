"""The signature table against real messages, one place: every row is exercised."""

import pytest

from dssup.supervisor.signatures import SIGNATURES, match, parse_bytes, parse_oom_numbers

# Real messages: from the captures, torch's allocator sources and the prior-art note.
MESSAGES = {
    "nccl-cuda-oom": "NCCL WARN Cuda failure 'out of memory' ncclGroupEnd() failed",
    "comm-bad-alloc": "MemoryError: std::bad_alloc",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 "
    "has a total capacity of 79.10 GiB of which 3.19 MiB is free.",
    "torch-oom-error": "OutOfMemoryError: XLA device ran out",
    "cuda-error-oom": "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be "
    "asynchronously reported at some other API call",
    "cublas-alloc": "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "xpu-oom": "RuntimeError: XPU out of memory. Tried to allocate 2.00 GiB",
    "cudnn-not-supported": "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may "
    "appear if you passed in a non-contiguous input.",
    "cpu-allocator": "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator:"
    " can't allocate memory: you tried to allocate 6291456 bytes. Error code 12 (Cannot allocate memory)",
    "python-memoryerror": "MemoryError",
    "numpy-alloc": "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 16.0 GiB for an "
    "array with shape (2147483648,) and data type float64",
    "rust-alloc": "memory allocation of 1048576 bytes failed",  # safetensors' writer, capped
    "errno-enomem": "OSError: [Errno 12] Cannot allocate memory",
    "dataloader-killed": "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
    "kernel-oom": "Memory cgroup out of memory: Killed process 1234 (python)",
    "gloo-peer-closed": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:27337",
    "gloo-conn-reset": "RuntimeError: [pair.cc:534] Read error [127.0.0.1]:1: Connection reset by peer",
    "nccl-watchdog": "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)",
    "nccl-teardown": "Some NCCL operations have failed or timed out. To avoid data inconsistency,"
    " we are taking the entire process down.",
    "nccl-remote": "NCCL communicator was aborted on rank 3.",
    "store-gone": "torch.distributed.DistStoreError: Socket Timeout",
    "missing-script": "/work/wt/sup/.venv/bin/python: can't open file '/nonexist/train.py': "
    "[Errno 2] No such file or directory",
    "missing-module": "/work/wt/sup/.venv/bin/python: No module named nonexist_mod_xyz",
    "syntax-error": "SyntaxError: invalid syntax",
    "import-error": "ModuleNotFoundError: No module named 'transformerz'",
    "file-not-found": "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.bin'",
    "name-error": "NameError: name 'modle' is not defined",
    "shape-mismatch": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x64 and 32x64)",
    "state-dict": "RuntimeError: Error(s) in loading state_dict for GPT:",
    "value-error": "ValueError: micro-batch 16 x accumulation 1 != 8 samples per rank",
    "argparse": "train.py: error: unrecognized arguments: --lr-warmup 3",
    "hf-arguments": "ValueError: Some specified arguments are not used by the HfArgumentParser: "
    "['--bogus_flag', '1']",
    "dist-backend": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970",
    "nccl-error": "RuntimeError: NCCL error: unhandled system error",
}


def test_every_signature_has_a_real_message():
    assert {s.name for s in SIGNATURES} == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_matches_its_row(name):
    sig = match(MESSAGES[name])
    assert sig is not None and sig.name == name


def test_unknown_message_matches_nothing():
    assert match("RuntimeError: flaky storage: checksum of shard 3 differs") is None


def test_cascade_rows_are_marked():
    cascades = {s.name for s in SIGNATURES if s.cascade}
    assert {"gloo-peer-closed", "nccl-watchdog", "nccl-teardown"} <= cascades
    assert "cuda-oom" not in cascades


def test_oom_numbers():
    msg = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB"
        " of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB "
        "memory in use. Of the allocated memory 74.12 GiB is allocated by PyTorch, and 512.00 MiB"
        " is reserved by PyTorch but unallocated."
    )
    n = parse_oom_numbers(msg)
    assert n["tried_to_allocate"] == 2 << 30
    assert n["free_bytes"] == parse_bytes("1.23", "GiB")
    assert n["in_use_bytes"] == parse_bytes("77.87", "GiB")
    assert n["reserved_unallocated"] == 512 << 20
    assert parse_oom_numbers(MESSAGES["cpu-allocator"]) == {"tried_to_allocate": 6291456}
