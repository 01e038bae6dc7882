"""Byte accounting of the expert-parallel runtime: what each rank sends, split into bytes that
cross node boundaries and bytes that stay inside a node, per named channel.

Channels (suffix ``.fwd`` / ``.bwd`` for the pass):
    dispatch        hidden-state rows of the dispatch (stage 1 + stage 2)
    dispatch_gates  the K gate weights that travel with each dispatched row
    combine         partial-sum rows of the combine (stage A + stage B)
    replica_params  parameter copies from main instances to replicas (forward only)
    replica_grads   replica gradients back to main instances (after backward)
    migration       main instances with their optimizer state moved by a layout change
    routing         the gathered expert ids (metadata)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["Traffic", "TrafficStats"]


@dataclass
class Traffic:
    """Rows and bytes sent by one rank on one channel."""

    cross_rows: int = 0
    intra_rows: int = 0
    cross_bytes: int = 0
    intra_bytes: int = 0

    def add(self, other: "Traffic") -> None:
        self.cross_rows += other.cross_rows
        self.intra_rows += other.intra_rows
        self.cross_bytes += other.cross_bytes
        self.intra_bytes += other.intra_bytes


@dataclass
class TrafficStats:
    """Per-channel counters of what this rank sent (see the module docstring for the channels)."""

    rank: int
    ranks_per_node: int
    channels: dict[str, Traffic] = field(default_factory=dict)

    def record(self, channel: str, send_splits: Sequence[int], row_bytes: int) -> None:
        """Counts `send_splits[j]` rows of `row_bytes` bytes sent to each rank j."""
        t = self.channels.setdefault(channel, Traffic())
        my_node = self.rank // self.ranks_per_node
        for peer, rows in enumerate(send_splits):
            if rows == 0 or peer == self.rank:
                continue
            if peer // self.ranks_per_node == my_node:
                t.intra_rows += rows
                t.intra_bytes += rows * row_bytes
            else:
                t.cross_rows += rows
                t.cross_bytes += rows * row_bytes

    def get(self, channel: str) -> Traffic:
        return self.channels.get(channel, Traffic())

    def cross_node_bytes(self, channels: Optional[Iterable[str]] = None) -> int:
        names = self.channels.keys() if channels is None else channels
        return sum(self.get(c).cross_bytes for c in names)

    def intra_node_bytes(self, channels: Optional[Iterable[str]] = None) -> int:
        names = self.channels.keys() if channels is None else channels
        return sum(self.get(c).intra_bytes for c in names)

    def reset(self) -> None:
        self.channels.clear()

    def snapshot(self) -> dict[str, Traffic]:
        return {k: Traffic(**vars(v)) for k, v in self.channels.items()}

    def global_totals(
        self, group: Optional[dist.ProcessGroup], channels: Sequence[str]
    ) -> dict[str, Traffic]:
        """Sums of every rank's counters for `channels` (a collective: call on every rank with
        the same channel list)."""
        values = torch.tensor(
            [[getattr(self.get(c), f) for f in ("cross_rows", "intra_rows", "cross_bytes",
                                                 "intra_bytes")] for c in channels],
            dtype=torch.int64,
        ).reshape(len(channels), 4)
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
        return {c: Traffic(*[int(v) for v in values[i].tolist()]) for i, c in enumerate(channels)}
