"""Multi-node agreement for ``dssup run``: one decision per generation, the same plan everywhere.

One ``dssup run`` per node, each wrapping its node's torchrun agent, agree through a directory
all nodes share (the checkpoint filesystem): heartbeats (``membership``), one decision per
generation published atomically by the lowest live node rank (``agree``), per-node reports
merged into one root cause (``rootcause``), split-brain detection (``splitbrain``), and
Kubernetes Events that fail soft (``kube``). ``MultiNodeSupervisor`` ties them into the
supervisor's loop. See docs/elastic.md.
"""

from dssup.supervisor.multinode.config import MultiNodeConfig
from dssup.supervisor.multinode.node import MultiNodeSupervisor
from dssup.supervisor.multinode.records import Decision, Member, NodeReport
from dssup.supervisor.multinode.rootcause import merge
from dssup.supervisor.multinode.store import SharedStore

__all__ = [
    "Decision",
    "Member",
    "MultiNodeConfig",
    "MultiNodeSupervisor",
    "NodeReport",
    "SharedStore",
    "merge",
]
