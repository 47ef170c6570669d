"""Benchmark worker: rank 1 hits a CUDA-OOM-worded ``torch.OutOfMemoryError`` whenever the
micro-batch is above 4, after writing the wall-clock time of its death to
``$BENCH_DEATH_FILE.<attempt>``; otherwise both ranks finish at once. Start-up is torch import
and a gloo group, nothing else, so launches are as cheap as torchrun allows. With
``BENCH_NO_RECORD=1`` the entry point is not wrapped in torchelastic's ``@record`` (no error
file: the traceback on stderr is all dssup sees), as in most scripts. With
``BENCH_START_FILE`` rank 1 also writes when its process started (before importing torch), so
a launcher's own relaunch can be timed from the outside. Each rank reports what it trains with
(``dssup.runtime.report_started``), so the benchmark's "global batch" line is the job's own."""

import os
import sys
import time

if os.environ.get("BENCH_START_FILE") and os.environ.get("RANK") == "1":  # before any import
    _restart = os.environ.get("DSSUP_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
    with open(f"{os.environ['BENCH_START_FILE']}.{_restart}", "w") as _fh:
        _fh.write(repr(time.time()))

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from dssup.runtime import clean_exit
from dssup.runtime.report import report_started

MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB "
    "of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB memory "
    "in use. Of the allocated memory 76.12 GiB is allocated by PyTorch, and 0.25 GiB is reserved "
    "by PyTorch but unallocated."
)


def main() -> None:
    dist.init_process_group("gloo")
    mb = int(os.environ.get("DSSUP_MICRO_BATCH_SIZE") or os.environ.get("BENCH_MB", "8"))
    # it follows the whole batch contract: the accumulation arrives with the micro-batch
    gas = int(os.environ.get("DSSUP_GRAD_ACCUM_STEPS") or 1)
    report_started(micro_batch=mb, grad_accum=gas, dp=dist.get_world_size())
    if dist.get_rank() == 1 and mb > 4:
        attempt = os.environ.get("DSSUP_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
        with open(f"{os.environ['BENCH_DEATH_FILE']}.{attempt}", "w") as fh:
            fh.write(repr(time.time()))
        raise torch.OutOfMemoryError(MESSAGE)
    for _ in range(gas):  # one synchronisation per micro-batch (a stand-in)
        dist.barrier()
    clean_exit(dist)


if __name__ == "__main__":
    entry = main if os.environ.get("BENCH_NO_RECORD") == "1" else record(main)
    sys.exit(entry())
