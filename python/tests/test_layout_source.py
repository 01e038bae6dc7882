"""cobalt.torch.layout_source: the sources' task assignment over micro-batches (no processes)."""

from __future__ import annotations

import numpy as np

import cobalt
from cobalt.torch import (FixedLayoutSource, PolicyLayoutSource, ScheduledLayoutSource,
                          routing_token_offset)

TOPOLOGY = cobalt.Topology(4, 8)  # 4 nodes x 2 ranks
NUM_EXPERTS, TOP_K = 8, 3


def _replicated_layout(shift: int) -> cobalt.ExpertLayout:
    """Rank r holds experts r, r - 2 - shift and r - 5 (mod 8): three replicas per expert on up
    to three nodes, so many tokens have several minimum covers to draw from."""
    slots = np.array([[r, (r - 2 - shift) % 8, (r - 5) % 8] for r in range(8)], dtype=np.int32)
    return cobalt.ExpertLayout(TOPOLOGY, NUM_EXPERTS, slots)


def _batch(ids: np.ndarray, sources: np.ndarray) -> cobalt.RoutingBatch:
    return cobalt.RoutingBatch(np.ascontiguousarray(ids), np.ascontiguousarray(sources),
                               NUM_EXPERTS, TOPOLOGY.num_ranks)


def _routing(seed: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(NUM_EXPERTS, TOP_K, replace=False) for _ in range(num_tokens)])
    return ids.astype(np.int32), rng.integers(0, TOPOLOGY.num_ranks, num_tokens, dtype=np.int32)


def test_routing_token_offset_is_keyed_by_the_routing() -> None:
    ids, sources = _routing(3, 50)
    offset = routing_token_offset(_batch(ids, sources))
    assert 0 <= offset < 2**62
    assert routing_token_offset(_batch(ids.copy(), sources.copy())) == offset  # content only
    other_ids = ids.copy()
    other_ids[7] = other_ids[7][::-1]  # the same experts in another order
    assert routing_token_offset(_batch(other_ids, sources)) != offset
    moved = sources.copy()
    moved[0] = (moved[0] + 1) % TOPOLOGY.num_ranks
    assert routing_token_offset(_batch(ids, moved)) != offset
    assert routing_token_offset(_batch(ids[:49], sources[:49])) != offset


def test_micro_batches_draw_apart_and_a_batch_draws_the_same() -> None:
    """Two micro-batches of a step that differ in one token draw their ties apart (with offset 0
    both would draw the same ties at the same positions); the same batch again at the same step
    is assigned the same (a source is a function of step, layer and batch, which activation
    checkpointing needs when a step forwards one routing twice)."""
    ids, sources = _routing(7, 400)
    other_ids = ids.copy()
    other_ids[-1] = (other_ids[-1] + 1) % NUM_EXPERTS
    layouts = [_replicated_layout(0), _replicated_layout(1)]
    for source in (FixedLayoutSource(layouts[0], seed=9),
                   ScheduledLayoutSource(layouts, 2, seed=9)):
        for step in range(3):
            layout, first = source.decide(step, 0, _batch(ids, sources))
            again = source.decide(step, 0, _batch(ids, sources))[1]
            np.testing.assert_array_equal(first, again)
            second = source.decide(step, 0, _batch(other_ids, sources))[1]
            # The 399 identical tokens draw their ties apart: some go elsewhere.
            assert not np.array_equal(first[:-1], second[:-1])
            for exec_rank, routing in ((first, ids), (second, other_ids)):
                cobalt.validate_assignment(_batch(routing, sources), layout, exec_rank)
                keyed = cobalt.assign_node_cover(
                    _batch(routing, sources), layout, seed=9, step=step, layer=0,
                    token_offset=routing_token_offset(_batch(routing, sources)))
                np.testing.assert_array_equal(exec_rank, keyed)


def test_policy_source_exposes_its_seed() -> None:
    source = PolicyLayoutSource("cobalt", TOPOLOGY, NUM_EXPERTS, TOP_K, seed=123)
    assert source.seed == 123 == source.config.seed
