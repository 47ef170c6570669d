"""Who is alive: each node's heartbeat in the shared directory, and the leader among them.

A node is *live* while its heartbeat is younger than ``timeout_s`` and it has not said it ended.
The leader is the lowest live node rank: no election round is needed, every node computes the
same answer from the same files, and when the leader dies the next one takes over once its
heartbeat is stale. Heartbeats are wall-clock stamps (nodes of one job share NTP time); the
timeout must be several heartbeat periods (defaults: 2 s period, 20 s timeout).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from dssup.supervisor.multinode.records import Member, MemberState
from dssup.supervisor.multinode.store import SharedStore

__all__ = ["Membership"]

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        store: SharedStore,
        node: int,
        heartbeat_s: float = 2.0,
        timeout_s: float = 20.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.node, self.clock = store, node, clock
        self.heartbeat_s, self.timeout_s = heartbeat_s, timeout_s
        self.state: MemberState = "waiting"
        self.generation = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_beat: list[Callable[[], None]] = []

    def key(self, node: int | None = None) -> str:
        return f"members/node-{self.node if node is None else node:04d}"

    def beat(self) -> None:
        with self._lock:
            rec = Member(
                node=self.node, host=socket.gethostname(), pid=os.getpid(), ts=self.clock(),
                state=self.state, generation=self.generation,
            )  # fmt: skip
            self.store.put(self.key(), rec.model_dump(mode="json"))

    def set(self, state: MemberState, generation: int) -> None:
        self.state, self.generation = state, generation
        self.beat()

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="dssup-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
                for hook in list(self.on_beat):
                    hook()
            except Exception:  # the heartbeat must outlive a flaky filesystem call
                log.exception("heartbeat failed")

    def stop(self, final: MemberState = "ended") -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s * 2)
        self.set(final, self.generation)

    def members(self) -> list[Member]:
        out = []
        for key in self.store.keys("members/"):
            doc = self.store.get(key)
            if doc is not None:
                out.append(Member.model_validate(doc))
        return out

    def live(self) -> list[Member]:
        """Members with a fresh heartbeat that have not ended, lowest rank first."""
        now = self.clock()
        alive = [m for m in self.members() if m.state != "ended" and now - m.ts < self.timeout_s]
        return sorted(alive, key=lambda m: m.node)

    def is_live(self, node: int) -> bool:
        return any(m.node == node for m in self.live())

    def leader(self) -> int | None:
        live = self.live()
        return live[0].node if live else None
