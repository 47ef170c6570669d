"""A shared directory as the agreement medium between the nodes' supervisors.

Multi-node training already needs a filesystem every node sees (the checkpoints live there), so
the nodes' ``dssup run`` processes agree through it instead of through a new service. Two
primitives are enough:

* ``put``: atomic replace (write a temporary file in the same directory, fsync, rename), for
  records one node owns and rewrites (its heartbeat, its evidence);
* ``publish``: atomic *exclusive* create (write a temporary file, then ``link`` it to the final
  name; ``link`` fails when the name exists, on local filesystems and on NFS alike), for records
  exactly one node may write (the decision of generation ``g``). Two would-be leaders racing for
  the same generation cannot both win: the loser reads the winner's record.

Readers never see a partial file. ``wait`` polls with a deadline and never returns a stale
record: the caller names the generation it wants.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SharedStore"]


class SharedStore:
    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.clock = clock
        root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def _tmp(self, target: Path, doc: dict[str, Any]) -> str:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        return tmp

    def put(self, key: str, doc: dict[str, Any]) -> None:
        """Atomically replace ``key`` (last writer wins)."""
        target = self.path(key)
        tmp = self._tmp(target, doc)
        try:
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def publish(self, key: str, doc: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Create ``key`` only if absent. Returns (we won, the record that stands)."""
        target = self.path(key)
        tmp = self._tmp(target, doc)
        try:
            os.link(tmp, target)
            won = True
        except FileExistsError:
            won = False
        finally:
            Path(tmp).unlink(missing_ok=True)
        if won:
            return True, doc
        existing = self.get(key)
        if existing is None:  # pragma: no cover - the winner's file is complete before link
            raise OSError(f"{target} exists but cannot be read")
        return False, existing

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path(key).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # only ever a foreign file: ours are renamed in complete
        return doc if isinstance(doc, dict) else None

    def keys(self, prefix: str) -> list[str]:
        """Keys under a folder prefix such as ``members/``, sorted."""
        folder = self.root / prefix
        if not folder.is_dir():
            return []
        return sorted(f"{prefix}{p.stem}" for p in folder.glob("*.json"))

    def wait(
        self,
        key: str,
        timeout_s: float,
        poll_s: float = 0.2,
        give_up: Callable[[], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any] | None:
        """The record ``key`` once it exists; None after ``timeout_s`` or when ``give_up()``."""
        deadline = self.clock() + timeout_s
        while True:
            doc = self.get(key)
            if doc is not None:
                return doc
            if self.clock() >= deadline or (give_up is not None and give_up()):
                return None
            sleep(poll_s)
