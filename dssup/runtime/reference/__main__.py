"""``python -m dssup.runtime.reference {measure,calibrate}``: the torch side of the CLI.

``dssup measure`` and ``dssup calibrate`` never import torch themselves (the CLI layer must not
import ``dssup.runtime``): they start this module as a child process, hand it a ``RunSpec`` as
JSON on stdin and read one JSON object back from stdout.
"""

from __future__ import annotations

import json
import sys

from dssup.runtime.reference.config import RunSpec


def main(argv: list[str]) -> int:
    """Run one command; 0 on success, 2 on bad usage."""
    if len(argv) != 2 or argv[0] not in {"measure-real", "measure-fake", "calibrate"}:
        sys.stderr.write(
            "usage: python -m dssup.runtime.reference "
            "{measure-real,measure-fake,calibrate} - < runspec.json\n"
        )
        return 2
    run = RunSpec.model_validate_json(sys.stdin.read() if argv[1] == "-" else argv[1])
    if argv[0] == "calibrate":
        from dssup.runtime.reference.calibrate import calibrate

        out = calibrate(run).model_dump(mode="json")
    else:
        from dssup.runtime.reference.measure import measure

        out = measure(run, "real" if argv[0] == "measure-real" else "fake").model_dump(mode="json")
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
