"""How much address space one step of ``zero_worker.py`` needs on this machine, per world size.

``python probe_zero.py --dim 512 2:8 1:8 1:4`` prints one JSON object: for each
``world:micro-batch`` the smallest ``memory_cap`` budget (bytes) under which a rank of that
world runs one optimizer step (``tests/memprobe.need_bytes``). As in the worker, the budget
covers the Adam moments of the rank's slice (allocated under the cap) and the step itself; the
world is emulated in one process by the slice's size, without collectives (gloo's chunk
buffers are left to the margin ``tests/memprobe.cap_between`` keeps).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))
import zero_worker as zw  # noqa: E402

from tests.memprobe import need_bytes  # noqa: E402


def main() -> None:
    configs = [a for a in sys.argv[1:] if ":" in a]
    args = zw.parse([a for a in sys.argv[1:] if ":" not in a])
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = zw.Net(args.vocab, args.dim)
    flat, grad = zw.flatten(model)
    out: dict[str, int] = {}
    for config in configs:
        world, mb = (int(x) for x in config.split(":"))
        share = args.global_batch_size // world
        lo, hi = zw.bounds(flat.numel(), 0, world)

        def step(world: int = world, mb: int = mb, share: int = share, n: int = hi - lo) -> None:
            m, v = torch.zeros(n), torch.zeros(n)
            zw.train_step(args, model, (flat, grad, m, v), 0, 0, share, mb, share // mb, world)

        step()  # warm-up: lazy imports, first use of every kernel
        out[config] = need_bytes(step)
    print(json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
