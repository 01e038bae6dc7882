"""Main-instance placement following a layout (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from cobalt.torch.main_placement import follow_layout, initial_main_placement


def test_initial_placement_is_static_ep() -> None:
    ranks, slots = initial_main_placement(10, 4, 3)
    np.testing.assert_array_equal(ranks, (np.arange(10) * 4) // 10)
    for r in range(4):
        assert sorted(slots[ranks == r]) == list(range(int((ranks == r).sum())))
    with pytest.raises(ValueError, match="capacity"):
        initial_main_placement(10, 4, 2)


def test_follow_layout_moves_only_what_it_must() -> None:
    rng = np.random.default_rng(0)
    g, m, experts, cap = 8, 4, 16, 4
    ranks, slots = initial_main_placement(experts, g, cap)
    for _ in range(20):
        layout = np.full((g, cap), -1)
        perm = rng.permutation(experts)
        for i, e in enumerate(perm):
            layout[i * g // experts, i % 2] = e
        for r in range(g):
            extra = [e for e in rng.permutation(experts) if e not in layout[r]]
            layout[r, 2:] = extra[:2]
        new_ranks, new_slots = follow_layout(layout, m, ranks, slots, cap)
        for e in range(experts):
            assert e in layout[new_ranks[e]]  # the main is where the layout holds e
            if e in layout[ranks[e]]:
                assert new_ranks[e] == ranks[e] and new_slots[e] == slots[e]
            elif any(e in layout[r] for r in range(g) if r // m == ranks[e] // m):
                assert new_ranks[e] // m == ranks[e] // m  # same node preferred
        for r in range(g):  # bank slots unique per rank and within capacity
            mine = new_slots[new_ranks == r]
            assert len(set(mine.tolist())) == len(mine) and (mine < cap).all()
        ranks, slots = new_ranks, new_slots
