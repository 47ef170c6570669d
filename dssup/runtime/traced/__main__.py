"""``python -m dssup.runtime.traced {measure-real,measure-fake,calibrate} -``: the torch side.

``dssup measure`` and ``dssup calibrate`` (``--hf``/``--module``) never import torch (the CLI
must not import ``dssup.runtime``): they start this module, hand it a JSON request on stdin and
read one JSON object back from the last line of stdout. Bad input (``ConfigError``) comes back
as ``{"error": {"field", "problem", "fix"}}`` with exit status 2, so the CLI can print the one
line it always prints for bad input; a profile the fit refuses as ``{"refused": message}``
(the traces that disagree) with exit status 3.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from dssup.errors import ConfigError
from dssup.runtime.traced.fit import FitError

COMMANDS = ("measure-real", "measure-fake", "calibrate")


def _answer(command: str, text: str) -> dict[str, object]:
    if command == "calibrate":
        from dssup.runtime.traced.calibrate import CalibrationRequest, calibrate

        return calibrate(CalibrationRequest.model_validate_json(text)).model_dump(mode="json")
    from dssup.runtime.traced.knobs import TracedRun
    from dssup.runtime.traced.step import measure

    run = TracedRun.model_validate_json(text)
    if command == "measure-real":
        return measure(run, "real").model_dump(mode="json")
    return measure(run, "fake", log_tensors=True).model_dump(mode="json")


def main(argv: list[str]) -> int:
    """Run one command; 0 on success, 2 on bad input or usage."""
    if len(argv) != 2 or argv[0] not in COMMANDS:
        sys.stderr.write(f"usage: python -m dssup.runtime.traced {{{','.join(COMMANDS)}}} -\n")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes
    text = sys.stdin.read() if argv[1] == "-" else argv[1]
    try:
        out = _answer(argv[0], text)
    except ConfigError as exc:
        err = {"field": exc.field, "problem": exc.problem, "fix": exc.fix}
        sys.stdout.write(json.dumps({"error": err}) + "\n")
        return 2
    except FitError as exc:  # the profile does not describe its own traces: refused
        sys.stdout.write(json.dumps({"refused": str(exc)}) + "\n")
        return 3
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
