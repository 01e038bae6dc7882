"""Sums over a process group for every floating dtype the runtime trains in.

gloo in torch 1.13 cannot all_reduce bfloat16 (``Invalid scalar type``): on gloo such a tensor is
summed in float32 and rounded back to its dtype once, as bf16 training stacks reduce gradients (a
sum with zeros only, as in gathering main weights, stays exact). Other backends reduce it as it
is."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["all_reduce_sum_"]

# Dtypes reduced in a wider one (the backend cannot reduce them).
_WIDENED = {torch.bfloat16: torch.float32}


def all_reduce_sum_(t: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """In place: t becomes the sum of t over `group` (a collective); returns t."""
    wide = _WIDENED.get(t.dtype) if dist.get_backend(group) == "gloo" else None
    if wide is None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t
    with torch.no_grad():
        widened = t.to(wide)
        dist.all_reduce(widened, op=dist.ReduceOp.SUM, group=group)
        t.copy_(widened)
    return t
