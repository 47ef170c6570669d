"""Benchmark worker: rank 1 hits a CUDA-OOM-worded ``torch.OutOfMemoryError`` whenever the
micro-batch is above 4, after writing the wall-clock time of its death to
``$BENCH_DEATH_FILE.<attempt>``; otherwise both ranks finish at once. Start-up is torch import
and a gloo group, nothing else, so launches are as cheap as torchrun allows."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from dssup.runtime import clean_exit

MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB "
    "of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB memory "
    "in use. Of the allocated memory 76.12 GiB is allocated by PyTorch, and 0.25 GiB is reserved "
    "by PyTorch but unallocated."
)


@record
def main() -> None:
    dist.init_process_group("gloo")
    mb = int(os.environ.get("DSSUP_MICRO_BATCH_SIZE") or os.environ.get("BENCH_MB", "8"))
    if dist.get_rank() == 1 and mb > 4:
        attempt = os.environ.get("DSSUP_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
        with open(f"{os.environ['BENCH_DEATH_FILE']}.{attempt}", "w") as fh:
            fh.write(repr(time.time()))
        raise torch.OutOfMemoryError(MESSAGE)
    dist.barrier()
    clean_exit(dist)


if __name__ == "__main__":
    sys.exit(main())
