"""Where the expert-parallel runtime gets each step's layout and task assignment from: the C++
policies (static, cobalt, cobalt+ and the reproduced peers: whatever ``cobalt.policy_names()``
lists), a fixed layout with Cobalt's Algorithm 1, or a schedule of layouts.

Every rank holds its own source and calls :meth:`decide` with the same global routing, so the
sources must be deterministic (the C++ policies are: same inputs and seed, same outputs, also
with planning on a background thread, whose result applies one step later on every rank).
"""

from __future__ import annotations

import hashlib
from typing import Optional, Protocol, Sequence

import numpy as np

import cobalt

__all__ = ["LayoutSource", "PolicyLayoutSource", "FixedLayoutSource", "ScheduledLayoutSource",
           "routing_token_offset"]


#: Tokens of a batch that routing_token_offset reads (evenly spaced, the first one included).
ROUTING_KEY_TOKENS = 4096


def routing_token_offset(batch: cobalt.RoutingBatch) -> int:
    """A ``token_offset`` for ``cobalt.assign_node_cover`` / ``assign_balanced_cover`` keyed by
    the batch's routing (its expert ids and source ranks), in [0, 2^62).

    Draws between tied minimum covers are keyed by (seed, step, layer, token_offset + t): with
    offset 0 the micro-batches of a step (gradient accumulation, evaluation batches) would all
    draw the same ties at the same token positions. Keyed by content, different batches draw
    apart, while the same batch at the same step draws the same: a source stays a function of
    (step, layer, batch), which activation checkpointing relies on when a step forwards the same
    routing twice (its recomputation must find one decision for that routing).

    The key reads the batch's shape and at most ``ROUTING_KEY_TOKENS`` evenly spaced tokens (ids
    and source ranks, little-endian), so it costs microseconds whatever the batch (hashing all of
    2^20 x 8 ids took twice as long as assigning them); two batches that differ only between the
    sampled tokens share their key, and so draw their ties alike, as every batch did with 0."""
    ids = np.asarray(batch.topk_ids)
    sources = np.asarray(batch.source_rank)
    stride = max(1, -(-ids.shape[0] // ROUTING_KEY_TOKENS))  # ceil(T / ROUTING_KEY_TOKENS)
    h = hashlib.blake2b(digest_size=8, person=b"cobalt-offset")
    h.update(str(tuple(ids.shape)).encode())
    for a in (ids[::stride], sources[::stride]):
        h.update(np.ascontiguousarray(a, dtype="<i4").tobytes())
    return int.from_bytes(h.digest(), "little") >> 2


class LayoutSource(Protocol):
    """decide(step, layer, batch) -> (layout in force, exec_rank [T, K] int32)."""

    name: str
    slots_per_rank: int

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]: ...


class PolicyLayoutSource:
    """A C++ policy made with ``cobalt.make_policy(name, PolicyConfig(...))``.

    `slots_per_rank` defaults to Cobalt's budget floor((1 + rho) E / G). `hidden` and `ffn` set
    the policy's byte sizes (token_bytes = 4 hidden, expert_param_bytes = 12 hidden ffn for fp32
    SwiGLU experts) for policies whose decisions weigh bytes. Other keyword arguments go to
    :class:`cobalt.PolicyConfig` (eps, steps_per_global_plan, ema_decay, seed, async_planning,
    planner_restarts, cost_model=cobalt.CostParams.from_presets(...) for cobalt+'s layout
    pricing, ...).
    """

    def __init__(self, name: str, topology: cobalt.Topology, num_experts: int, top_k: int, *,
                 num_layers: int = 1, slots_per_rank: Optional[int] = None, rho: float = 0.5,
                 hidden: Optional[int] = None, ffn: Optional[int] = None, **config: object) -> None:
        if slots_per_rank is None:
            slots_per_rank = cobalt.slots_for_rho(num_experts, topology.num_ranks, rho)
        extra: dict[str, object] = dict(config)
        if hidden is not None:
            extra.setdefault("token_bytes", 4.0 * hidden)
            if ffn is not None:
                extra.setdefault("expert_param_bytes", 12.0 * hidden * ffn)
        self.config = cobalt.PolicyConfig(topology, num_experts, top_k, num_layers=num_layers,
                                          slots_per_rank=slots_per_rank, **extra)
        self.policy = cobalt.make_policy(name, self.config)
        self.seed = self.config.seed
        self.name = name
        self.slots_per_rank = slots_per_rank

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        return self.policy.run(step, layer, batch)


class FixedLayoutSource:
    """One layout for every step; tasks assigned by Cobalt's Algorithm 1 (node cover), with the
    draws between tied covers keyed by the batch's routing (:func:`routing_token_offset`), so
    micro-batches of a step draw apart and the same batch draws the same."""

    def __init__(self, layout: cobalt.ExpertLayout, *, seed: int = 0, name: str = "fixed") -> None:
        self.layout = layout
        self.seed = seed
        self.name = name
        self.slots_per_rank = layout.slots_per_rank

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        return self.layout, cobalt.assign_node_cover(batch, self.layout, seed=self.seed,
                                                     step=step, layer=layer,
                                                     token_offset=routing_token_offset(batch))


class ScheduledLayoutSource:
    """Switches layouts on a schedule: step s uses layouts[(s // period) % len(layouts)], tasks by
    Algorithm 1 (draws keyed as in :class:`FixedLayoutSource`). For exercising layout changes
    (migration, versioning) deterministically."""

    def __init__(self, layouts: Sequence[cobalt.ExpertLayout], period: int, *, seed: int = 0,
                 name: str = "scheduled") -> None:
        if not layouts:
            raise ValueError("ScheduledLayoutSource: need at least one layout")
        if period < 1:
            raise ValueError(f"ScheduledLayoutSource: period {period} must be >= 1")
        sizes = {layout.slots_per_rank for layout in layouts}
        if len(sizes) != 1:
            raise ValueError(f"ScheduledLayoutSource: layouts differ in slots per rank {sizes}")
        self.layouts = list(layouts)
        self.period = period
        self.seed = seed
        self.name = name
        self.slots_per_rank = sizes.pop()

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        layout = self.layouts[(step // self.period) % len(self.layouts)]
        return layout, cobalt.assign_node_cover(batch, layout, seed=self.seed, step=step,
                                                layer=layer,
                                                token_offset=routing_token_offset(batch))
