"""cobalt.torch.layout_source: the sources' task assignment over micro-batches (no processes)."""

from __future__ import annotations

import numpy as np

import cobalt
from cobalt.torch import (FixedLayoutSource, PolicyLayoutSource, ScheduledLayoutSource,
                          StepTokenOffsets)

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


def test_step_token_offsets_continue_within_a_step_and_restart_with_the_next() -> None:
    offsets = StepTokenOffsets()
    assert offsets.take(3, 0, 10) == 0
    assert offsets.take(3, 1, 7) == 0  # layers number their own tokens
    assert offsets.take(3, 0, 5) == 10
    assert offsets.take(3, 0, 0) == 15
    assert offsets.take(3, 1, 1) == 7
    assert offsets.take(4, 0, 4) == 0  # a new step starts at 0
    assert offsets.take(4, 0, 4) == 4


def test_micro_batches_are_assigned_as_the_step_given_whole() -> None:
    """Each token draws its own tie: the micro-batches of a step continue its token numbering,
    so their assignments, concatenated, are the whole step's, and differ from numbering every
    micro-batch from 0 (where the second half would repeat the first half's draws)."""
    ids, sources = _routing(7, 400)
    layouts = [_replicated_layout(0), _replicated_layout(1)]
    for make in (lambda: FixedLayoutSource(layouts[0], seed=9),
                 lambda: ScheduledLayoutSource(layouts, 2, seed=9)):
        split, whole = make(), make()
        for step in range(3):
            first = split.decide(step, 0, _batch(ids[:250], sources[:250]))[1]
            second = split.decide(step, 0, _batch(ids[250:], sources[250:]))[1]
            all_at_once = whole.decide(step, 0, _batch(ids, sources))[1]
            np.testing.assert_array_equal(np.concatenate([first, second]), all_at_once)
        layout = split.decide(3, 0, _batch(ids[:1], sources[:1]))[0]
        from_zero = cobalt.assign_node_cover(_batch(ids[250:], sources[250:]), layout, seed=9,
                                             step=2, layer=0)
        assert not np.array_equal(from_zero, all_at_once[250:])  # the draws depend on the offset


def test_policy_source_exposes_its_seed() -> None:
    source = PolicyLayoutSource("cobalt", TOPOLOGY, NUM_EXPERTS, TOP_K, seed=123)
    assert source.seed == 123 == source.config.seed
