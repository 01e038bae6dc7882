"""Worker code of test_launch.py (runs inside spawned gloo processes)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def one_rank_fails(rank: int, world: int, failing_rank: int) -> None:
    """`failing_rank` raises; the others wait in a collective and fail once it is gone."""
    dist.barrier()
    if rank == failing_rank:
        raise ValueError(f"the root cause, on rank {rank}")
    dist.all_reduce(torch.ones(1))
