"""Expert-parallel process group: G ranks in N nodes of M ranks each (rank r on node r // M).

Nodes may be real or simulated (several processes of one machine labelled as one node): the
runtime only uses the labels to decide which transfers are node-local and to count bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

import cobalt

__all__ = ["EPGroup"]


@dataclass(frozen=True)
class EPGroup:
    """Where this process sits in the expert-parallel group.

    Attributes:
        group: the torch.distributed process group (None = the default group).
        rank: this process's rank in `group`.
        world_size: G.
        ranks_per_node: M; G must be a multiple of M.
    """

    group: Optional[dist.ProcessGroup]
    rank: int
    world_size: int
    ranks_per_node: int

    @staticmethod
    def create(ranks_per_node: int, group: Optional[dist.ProcessGroup] = None) -> "EPGroup":
        """Reads rank and size from `group` and validates the node shape.

        Raises ValueError (on every rank alike, before any collective, so nothing hangs) when the
        world size is not a positive multiple of `ranks_per_node`, and RuntimeError when
        torch.distributed is not initialised.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "EPGroup: torch.distributed is not initialised (call init_process_group first)"
            )
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        return EPGroup.from_sizes(rank, world, ranks_per_node, group)

    @staticmethod
    def from_sizes(
        rank: int, world_size: int, ranks_per_node: int, group: Optional[dist.ProcessGroup] = None
    ) -> "EPGroup":
        """Like :meth:`create` with explicit sizes (validated the same way). When
        torch.distributed is initialised, the sizes must be the group's own (`group`, or the
        default group): other sizes would fail at the first exchange with gloo's message."""
        if dist.is_available() and dist.is_initialized():
            actual_world, actual_rank = dist.get_world_size(group), dist.get_rank(group)
            if (world_size, rank) != (actual_world, actual_rank):
                raise ValueError(
                    f"EPGroup: rank {rank} of world size {world_size} given, but the process "
                    f"group has this process as rank {actual_rank} of {actual_world} (use "
                    "EPGroup.create, or the group's own sizes)")
        if ranks_per_node < 1:
            raise ValueError(f"EPGroup: ranks_per_node {ranks_per_node} must be >= 1")
        if world_size < 1 or world_size % ranks_per_node != 0:
            raise ValueError(
                f"EPGroup: world size {world_size} is not divisible by ranks_per_node "
                f"{ranks_per_node} (need G = N * M ranks)"
            )
        if world_size // ranks_per_node > cobalt.MAX_NODES:
            raise ValueError(
                f"EPGroup: {world_size // ranks_per_node} nodes exceed the maximum of "
                f"{cobalt.MAX_NODES}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"EPGroup: rank {rank} out of range [0, {world_size})")
        return EPGroup(group, rank, world_size, ranks_per_node)

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def rail_peer(self, node: int) -> int:
        """The rank on `node` with this rank's local index (where cross-node traffic lands)."""
        return node * self.ranks_per_node + self.local_rank

    @property
    def topology(self) -> cobalt.Topology:
        return cobalt.Topology(self.num_nodes, self.world_size)

    def global_rank(self, group_rank: int) -> int:
        """The default-group rank of `group_rank` (what torch.distributed's p2p calls need)."""
        if self.group is None:
            return group_rank
        return dist.distributed_c10d._get_global_rank(self.group, group_rank)
