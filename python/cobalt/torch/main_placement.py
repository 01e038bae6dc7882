"""Where each expert's *main instance* (the trainable parameters and their optimizer state) lives,
and how it follows a new layout. Pure numpy, identical on every rank."""

from __future__ import annotations

import numpy as np

__all__ = ["initial_main_placement", "follow_layout"]


def initial_main_placement(num_experts: int, num_ranks: int, capacity: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Static EP: expert e's main on rank floor(e G / E), bank slots in expert order.

    Returns (main_rank [E], main_slot [E]) int64. Raises ValueError when a rank would need more
    than `capacity` slots.
    """
    ranks = (np.arange(num_experts, dtype=np.int64) * num_ranks) // num_experts
    slots = np.zeros(num_experts, dtype=np.int64)
    for r in range(num_ranks):
        mine = np.flatnonzero(ranks == r)
        if mine.shape[0] > capacity:
            raise ValueError(
                f"main placement: rank {r} needs {mine.shape[0]} expert slots, capacity is "
                f"{capacity} (slots_per_rank must be >= ceil(E / G))"
            )
        slots[mine] = np.arange(mine.shape[0])
    return ranks, slots


def follow_layout(slots: np.ndarray, ranks_per_node: int, main_rank: np.ndarray,
                  main_slot: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Moves every main instance whose rank no longer holds its expert in the layout `slots`
    [G, S] to a rank that does: same node first (an NVLink move), then the holder with the
    fewest mains, then the lowest rank. Mains that stay keep their bank slot; arriving mains take
    the lowest free bank slots in expert order (slots vacated in the same move may be reused:
    every row is read before any is written).

    Returns (new_main_rank [E], new_main_slot [E]).
    """
    g = slots.shape[0]
    num_experts = main_rank.shape[0]
    holders: list[list[int]] = [[] for _ in range(num_experts)]
    for r in range(g):
        for e in slots[r]:
            if e >= 0:
                holders[int(e)].append(r)
    new_rank = main_rank.copy()
    new_slot = main_slot.copy()
    stays = np.array([int(main_rank[e]) in holders[e] for e in range(num_experts)], dtype=bool)
    count = np.bincount(main_rank[stays], minlength=g)
    movers = np.flatnonzero(~stays)
    for e in movers:
        if not holders[e]:
            raise ValueError(f"main placement: expert {e} has no replica in the layout")
        old_node = int(main_rank[e]) // ranks_per_node
        pool = [r for r in holders[e] if r // ranks_per_node == old_node] or holders[e]
        r = min(pool, key=lambda q: (count[q], q))
        count[r] += 1
        new_rank[e] = r
    for r in range(g):
        used = set(int(s) for s in main_slot[stays & (main_rank == r)])
        free = (s for s in range(capacity) if s not in used)
        for e in movers[new_rank[movers] == r]:
            s = next(free, None)
            if s is None:
                raise ValueError(f"main placement: rank {r} has no free bank slot for expert {e}")
            new_slot[e] = s
    return new_rank, new_slot
