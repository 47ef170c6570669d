"""The repository's working-tree state, for tests that run commands a user would run and must
leave nothing behind in the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["REPO", "repo_state"]

REPO = Path(__file__).resolve().parents[1]


def repo_state() -> str:
    """``git status --porcelain`` with untracked files: what a test compares before and after."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout
