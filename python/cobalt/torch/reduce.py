"""Sums over a process group for every floating dtype the runtime trains in.

gloo in torch 1.13 cannot all_reduce bfloat16 (``Invalid scalar type``): on gloo such a tensor is
summed in float32 and rounded back to its dtype once, as bf16 training stacks reduce gradients.
Other backends reduce it as it is. Gathering rows that live on one rank each (main weights) goes
through :func:`all_reduce_disjoint_`, which keeps every bit."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["all_reduce_sum_", "all_reduce_disjoint_"]

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


# Integer dtypes of each element size, and what gloo sums them in.
_BITS = {1: (torch.int8, torch.int32), 2: (torch.int16, torch.int32), 4: (torch.int32, None),
         8: (torch.int64, None)}


def all_reduce_disjoint_(t: torch.Tensor, group: Optional[dist.ProcessGroup] = None
                         ) -> torch.Tensor:
    """In place, for a contiguous `t` that is zero (+0.0) on every rank but at most one at each
    position: t becomes that one rank's value, bit for bit (-0.0 and NaN payloads included, which
    a floating sum with zeros would not keep), whatever the dtype. A collective: the bit patterns
    are summed as integers. Returns t."""
    if not t.is_contiguous():
        raise ValueError("all_reduce_disjoint_: the tensor must be contiguous")
    bits_dtype, wide = _BITS[t.element_size()]
    with torch.no_grad():
        bits = t.view(bits_dtype)
        summed = bits if wide is None else bits.to(wide)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        if wide is not None:
            bits.copy_(summed.to(bits_dtype))  # one non-zero addend: the sum fits
    return t
