"""The CLI imports a command's module when the command is asked for, and freezes the import-time
heap only when it runs as the process's own command line."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dssup.cli import main

COMMANDS = {
    "admit", "calibrate", "demo", "estimate", "gpus", "measure", "models", "plan",
    "plan-elastic", "run", "status", "webhook",
}  # fmt: skip


def test_help_lists_every_command() -> None:
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    listed = {line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line}
    assert listed == COMMANDS


def test_plan_imports_neither_the_webhook_nor_the_supervisor() -> None:
    code = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from dssup.cli import main\n"
        "res = CliRunner().invoke(main, ['plan', '--help'])\n"
        "assert res.exit_code == 0, res.output\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('dssup.admission', "
        "'dssup.supervisor', 'dssup.cli.')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "dssup.cli.plan" in loaded
    assert not [m for m in loaded if m.startswith(("dssup.admission", "dssup.supervisor"))]


def test_run_gets_its_multi_node_options() -> None:
    res = CliRunner().invoke(main, ["run", "--help"])
    assert res.exit_code == 0 and "--node-rank" in res.output and "--shared-dir" in res.output


def test_the_heap_is_frozen_only_for_the_process_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert gc.get_freeze_count() == 0
    assert CliRunner().invoke(main, ["gpus"]).exit_code == 0
    assert gc.get_freeze_count() == 0  # a test runner's call leaves its process alone
    monkeypatch.setattr(sys, "argv", ["dssup", "gpus"])
    try:
        main.main(standalone_mode=False)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
