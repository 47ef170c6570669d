"""examples/train_tiny.py with two test-only knobs that a real job would not need.

* ``--cap-node N``: torchrun's c10d rendezvous hands out global ranks in an order the test
  cannot choose, so "an OOM on node 1" is expressed by node: when ``DSSUP_NODE_RANK`` (set by
  dssup on every attempt) equals N this worker caps its own rank's memory, others run uncapped;
  ``{node}`` in any argument (a ``--memory-cap-file`` kept from one generation to the next)
  becomes the node rank.
* ``--step-delay S``: sleep S seconds after each step, so a test has time to kill or add a
  node mid-run on a 2-core machine where a real step takes milliseconds.

Everything else is the example job itself (loaded as a module, its ``main`` called).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_tiny.py"


def _take(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def main() -> None:
    argv = [a.replace("{node}", os.environ.get("DSSUP_NODE_RANK", "")) for a in sys.argv[1:]]
    cap_node, delay = _take(argv, "--cap-node"), float(_take(argv, "--step-delay") or 0)
    ranks = os.environ["RANK"] if os.environ.get("DSSUP_NODE_RANK") == cap_node else "none"
    sys.argv = [str(EXAMPLE), *argv, "--memory-cap-ranks", ranks]
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    step = mod.train_step

    def slow_step(*args: Any) -> float:
        loss: float = step(*args)
        time.sleep(delay)
        return loss

    mod.train_step = slow_step
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mod.torch.set_num_threads(1)
    mod.main()


if __name__ == "__main__":
    main()
