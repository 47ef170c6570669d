"""``python -m dssup.runtime.traced {measure-real,measure-fake} -``: the torch side.

``dssup measure --hf/--module`` never imports torch (the CLI
must not import ``dssup.runtime``): it starts this module, hand it a JSON request on stdin and
read one JSON object back from the last line of stdout. Bad input (``ConfigError``) comes back
as ``{"error": {"field", "problem", "fix"}}`` with exit status 2, so the CLI can print the one
line it always prints for bad input.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from dssup.errors import ConfigError

COMMANDS = ("measure-real", "measure-fake")


def _answer(command: str, text: str) -> dict[str, object]:
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
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
