"""Compare two saved state dicts: relative L2 difference over all weights, and the largest
element difference. Prints one JSON object; exit 1 when the relative difference exceeds
``--rtol`` (default 1e-5).

    python examples/compare_weights.py recovered.pt reference.pt
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    if a.keys() != b.keys():
        raise SystemExit(f"different parameters: {sorted(a.keys() ^ b.keys())}")
    diff = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a) ** 0.5
    norm = sum(float((b[k].double() ** 2).sum()) for k in a) ** 0.5
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    return {"relative_l2": diff / norm, "max_abs": worst, "tensors": len(a)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-5)
    args = p.parse_args()
    result = compare(torch.load(args.a), torch.load(args.b))
    result["within_rtol"] = result["relative_l2"] <= args.rtol
    print(json.dumps(result))
    return 0 if result["within_rtol"] else 1


if __name__ == "__main__":
    sys.exit(main())
