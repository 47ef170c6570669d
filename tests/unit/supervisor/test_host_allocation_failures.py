"""Host allocation failures outside torch are host-oom with their message kept: real failures
under an address-space cap (safetensors' Rust writer aborts, numpy raises), read back from a
rank's output as dssup reads an attempt without @record (a failure after training is in
test_final_save.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dssup.supervisor.classify import classify
from dssup.supervisor.evidence import collect
from dssup.supervisor.models import FailureKind

SAFETENSORS = """
import resource, torch
from safetensors.torch import save_file
from dssup.runtime import memory_cap
weights = {"w": torch.ones(1 << 20)}
memory_cap(0)
save_file(weights, sys.argv[1])
"""
NUMPY = """
import resource, numpy
from dssup.runtime import memory_cap
memory_cap(64 << 20)
numpy.ones(1 << 28)
"""


def _fail_in_a_rank(tmp_path: Path, code: str) -> Path:
    """Run ``code`` as rank 1 would, its stderr where torchrun keeps a rank's output."""
    rank = tmp_path / "logs" / "run_x" / "attempt_0" / "1"
    rank.mkdir(parents=True)
    with open(rank / "stderr.log", "w") as err:
        done = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(tmp_path / "w")],
                              stderr=err, stdout=subprocess.DEVNULL, timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0
    return tmp_path


@pytest.mark.torch
def test_a_safetensors_writer_abort_is_host_oom_with_its_line(tmp_path):
    pytest.importorskip("safetensors")
    failure = classify(collect(_fail_in_a_rank(tmp_path, SAFETENSORS), 1, "", world_size=2))
    assert failure is not None and failure.kind == FailureKind.HOST_OOM
    assert failure.signature == "rust-alloc" and failure.rank == 1
    assert "memory allocation of" in failure.message and "bytes failed" in failure.message


@pytest.mark.torch
def test_a_numpy_allocation_failure_is_host_oom_with_its_message(tmp_path):
    pytest.importorskip("numpy")
    failure = classify(collect(_fail_in_a_rank(tmp_path, NUMPY), 1, "", world_size=2))
    assert failure is not None and failure.kind == FailureKind.HOST_OOM
    assert failure.signature == "numpy-alloc" and "Unable to allocate" in failure.message
