"""Model states under ZeRO 0-3 and offload (spec section 5).

Non-MoE parameters are sharded over the data-parallel group, MoE parameters over the expert
data-parallel group. Offload (``offload.py``): the ``paper`` convention moves only the optimizer
states (and ZeRO-3 weights) to the host; the frameworks' layout (``deepspeed_offload``) also takes
ZeRO-2/3 gradient partitions off the GPU, as DeepSpeed reduces them straight into the host. Shards are whole elements: rank r of n holds ``total // n`` plus one of the
remainder, so the ranks' shards add up to the total exactly and rank 0 holds the most.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssup.memory.config import Precision

__all__ = ["ModelStates", "model_states", "shard_sizes"]


def shard_sizes(total: int, n: int) -> list[int]:
    """Elements held by each of ``n`` ranks when ``total`` is split as evenly as possible."""
    q, r = divmod(total, n)
    return [q + 1 if i < r else q for i in range(n)]


def _largest_shard(total: int, n: int) -> int:
    return -(-total // n)


@dataclass(frozen=True, slots=True)
class ModelStates:
    weights: int
    gradients: int
    optimizer: int
    host: int
    shard_params: int  # parameters in this rank's optimizer shard


def model_states(
    non_moe: int,
    moe: int,
    dp: int,
    edp: int,
    zero: int,
    precision: Precision,
    offload_optimizer: bool,
    offload_params: bool,
    deepspeed_offload: bool = False,
) -> ModelStates:
    """Device and host bytes of weights, gradients and optimizer states on one rank. ``host`` is
    what the paper convention moves (optimizer, weights); ``core.py`` counts DeepSpeed's host
    buffers with ``offload.host_states`` instead."""
    full = non_moe + moe
    shard = _largest_shard(non_moe, dp) + _largest_shard(moe, edp)
    weights = precision.weights * (shard if zero >= 3 else full)
    gradients = precision.gradients * (shard if zero >= 2 else full)
    optimizer = precision.optimizer * (shard if zero >= 1 else full)
    host = 0
    if offload_optimizer:
        host, optimizer = host + optimizer, 0
        if deepspeed_offload and zero >= 2:
            gradients = 0
    if offload_params:
        host, weights = host + weights, 0
    return ModelStates(weights, gradients, optimizer, host, shard if zero >= 1 else full)
