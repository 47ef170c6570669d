"""Elastic planning: keep the user's global batch exact whatever the world size.

Pure (standard library, pydantic and ``dssup.memory`` only): the global-batch solver (which
node counts can keep the batch, with which micro-batch/accumulation pairs, and which of those
fit each GPU type) and predictive re-planning when nodes leave or join. The processes that act
on these plans live in ``dssup.supervisor.multinode``. See docs/elastic.md.
"""

from dssup.elastic.batch import NodeRange, Split, divisors, dp_size, splits, world_sizes
from dssup.elastic.fit import Fitted, MemoryContext, search_plans
from dssup.elastic.models import BatchPlan
from dssup.elastic.replan import Replan, replan, rescale
from dssup.elastic.solver import ElasticRequest, ElasticRow, ElasticTable, GpuFit, solve

__all__ = [
    "BatchPlan",
    "ElasticRequest",
    "ElasticRow",
    "ElasticTable",
    "Fitted",
    "GpuFit",
    "MemoryContext",
    "NodeRange",
    "Replan",
    "Split",
    "divisors",
    "dp_size",
    "replan",
    "rescale",
    "search_plans",
    "solve",
    "splits",
    "world_sizes",
]
