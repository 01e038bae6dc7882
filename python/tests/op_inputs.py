"""Random inputs shared by the tests of cobalt.torch.ops and cobalt.cuda."""

from __future__ import annotations

import numpy as np
import torch

import cobalt


def random_ids(rng: np.random.Generator, num_tokens: int, num_experts: int, top_k: int,
               skew: float = 0.0) -> torch.Tensor:
    """topk_ids [T, K] int32, distinct per row; skew > 0 favours low ids."""
    p = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    p /= p.sum()
    rows = [rng.choice(num_experts, top_k, replace=False, p=p) for _ in range(num_tokens)]
    return torch.from_numpy(np.array(rows, dtype=np.int32).reshape(num_tokens, top_k))


def random_layout(rng: np.random.Generator, topology: cobalt.Topology, num_experts: int,
                  slots_per_rank: int, fill: float = 0.7) -> cobalt.ExpertLayout:
    """Static EP plus random extra replicas in `fill` of the free slots."""
    base = cobalt.ExpertLayout.static_ep(topology, num_experts, slots_per_rank)
    lists = [[int(e) for e in row if e >= 0] for row in np.asarray(base.slots)]
    for rank_lists in lists:
        free = slots_per_rank - len(rank_lists)
        for e in rng.permutation(num_experts)[: int(free * fill)]:
            if int(e) not in rank_lists:
                rank_lists.append(int(e))
    return cobalt.ExpertLayout.from_rank_lists(topology, num_experts, slots_per_rank, lists)


def random_sources(rng: np.random.Generator, num_tokens: int, num_ranks: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, num_ranks, num_tokens, dtype=np.int32))


def demand_of(ids: torch.Tensor, sources: torch.Tensor, num_ranks: int,
              num_experts: int) -> torch.Tensor:
    """TopoEP's Omega [G, E] int64 of a batch."""
    omega = np.zeros((num_ranks, num_experts), dtype=np.int64)
    np.add.at(omega, (np.repeat(sources.numpy(), ids.shape[1]), ids.numpy().ravel()), 1)
    return torch.from_numpy(omega)
