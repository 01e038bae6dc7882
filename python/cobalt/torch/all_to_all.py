"""Differentiable row exchange over ``all_to_all_single`` with uneven splits (gloo supports the
single-tensor form with split sizes; the list form ``all_to_all`` is not implemented for gloo in
torch 1.13, so this is the one primitive the runtime needs).

An exchange only moves bytes, so a dtype the backend cannot carry (gloo in torch 1.13 rejects
bfloat16 with ``Invalid scalar type``) travels as its bytes (a uint8 view: gloo carries no 16-bit
integers either) and arrives bit for
bit."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from cobalt.torch.traffic import TrafficStats

__all__ = ["all_to_all_rows", "exchange_rows"]

# Dtypes exchanged as a uint8 view of their bytes (the backend cannot carry them; the bytes are
# unchanged, so nothing is rounded).
_CARRIERS = {torch.bfloat16: torch.uint8}

# (channel name, number of columns) pieces of a row, for byte accounting.
RowParts = Sequence[tuple[str, int]]


def exchange_rows(
    x: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    group: Optional[dist.ProcessGroup],
) -> torch.Tensor:
    """Sends rows of x [sum(send_splits), ...] (rows for rank 0 first) and returns the received
    rows [sum(recv_splits), ...], ordered by sender. Not differentiable. Raises ValueError for a
    0-d x (it has no rows)."""
    if x.dim() == 0:
        raise ValueError("exchange_rows: x is 0-d; it needs a leading dimension of rows")
    x = x.contiguous()
    out = x.new_empty((int(sum(recv_splits)),) + tuple(x.shape[1:]))
    carrier = _CARRIERS.get(x.dtype)
    if carrier is None:
        dist.all_to_all_single(out, x, list(recv_splits), list(send_splits), group=group)
    else:
        # The byte view widens the last dimension, so it must not be the rows' one: 1-d rows get a
        # unit column (views of x and out, so out is filled in place).
        send, recv = (x, out) if x.dim() >= 2 else (x.unsqueeze(-1), out.unsqueeze(-1))
        if send.stride(-1) != 1:  # a byte view needs unit-stride rows
            send = send.clone(memory_format=torch.contiguous_format)
        dist.all_to_all_single(recv.view(carrier), send.view(carrier), list(recv_splits),
                               list(send_splits), group=group)
    return out


def _record(stats: Optional[TrafficStats], parts: RowParts, suffix: str,
            splits: Sequence[int], itemsize: int) -> None:
    if stats is None:
        return
    for name, cols in parts:
        stats.record(f"{name}.{suffix}", splits, cols * itemsize)


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                group: Optional[dist.ProcessGroup], stats: Optional[TrafficStats],
                parts: RowParts) -> torch.Tensor:
        ctx.send_splits, ctx.recv_splits = send_splits, recv_splits
        ctx.group, ctx.stats, ctx.parts = group, stats, parts
        _record(stats, parts, "fwd", send_splits, x.element_size())
        return exchange_rows(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        # The reverse exchange: each received row's gradient goes back to its sender.
        _record(ctx.stats, ctx.parts, "bwd", ctx.recv_splits, grad.element_size())
        grad_in = exchange_rows(grad, ctx.recv_splits, ctx.send_splits, ctx.group)
        return grad_in, None, None, None, None, None


def all_to_all_rows(
    x: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    group: Optional[dist.ProcessGroup] = None,
    stats: Optional[TrafficStats] = None,
    parts: Optional[RowParts] = None,
) -> torch.Tensor:
    """Differentiable :func:`exchange_rows`: x [sum(send_splits), W] -> [sum(recv_splits), W].

    The backward pass sends each gradient row back to where the row came from (the same rows
    cross the same links in the other direction). `parts` names the column ranges of a row for
    `stats` (default: one channel "rows" of W columns).
    """
    if x.dim() != 2:
        raise ValueError(f"all_to_all_rows: expected a 2-d tensor [rows, W], got {tuple(x.shape)}")
    if len(send_splits) != len(recv_splits):
        raise ValueError("all_to_all_rows: send and receive splits differ in length")
    if int(sum(send_splits)) != x.shape[0]:
        raise ValueError(
            f"all_to_all_rows: {x.shape[0]} rows but send splits sum to {int(sum(send_splits))}"
        )
    row_parts: RowParts = parts if parts is not None else (("rows", int(x.shape[1])),)
    return _AllToAllRows.apply(x, list(send_splits), list(recv_splits), group, stats, row_parts)
