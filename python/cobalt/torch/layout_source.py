"""Where the expert-parallel runtime gets each step's layout and task assignment from: the C++
policies (static, cobalt, cobalt+ and the reproduced peers: whatever ``cobalt.policy_names()``
lists), a fixed layout with Cobalt's Algorithm 1, or a schedule of layouts.

Every rank holds its own source and calls :meth:`decide` with the same global routing, so the
sources must be deterministic (the C++ policies are: same inputs and seed, same outputs, also
with planning on a background thread, whose result applies one step later on every rank).
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

import numpy as np

import cobalt

__all__ = ["LayoutSource", "PolicyLayoutSource", "FixedLayoutSource", "ScheduledLayoutSource",
           "StepTokenOffsets"]


class StepTokenOffsets:
    """Numbers the tokens of a step's calls per layer, for the ``token_offset`` of
    ``cobalt.assign_node_cover`` / ``assign_balanced_cover``: the calls of one (step, layer)
    (micro-batches of gradient accumulation, evaluation batches) continue one numbering, so each
    token draws its own tie between minimum covers, as the C++ policies number a step's tokens.
    The numbering restarts at 0 with each new step of a layer."""

    def __init__(self) -> None:
        self._next: dict[int, tuple[int, int]] = {}  # layer -> (step, offset of its next call)

    def take(self, step: int, layer: int, num_tokens: int) -> int:
        """The offset of this call's first token; the next call of (step, layer) starts after
        its num_tokens tokens."""
        last_step, offset = self._next.get(layer, (step, 0))
        if last_step != step:
            offset = 0
        self._next[layer] = (step, offset + num_tokens)
        return offset


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
    """One layout for every step; tasks assigned by Cobalt's Algorithm 1 (node cover). The calls
    of one (step, layer) number their tokens on (:class:`StepTokenOffsets`), so a step given as
    micro-batches is assigned as the step given whole."""

    def __init__(self, layout: cobalt.ExpertLayout, *, seed: int = 0, name: str = "fixed") -> None:
        self.layout = layout
        self.seed = seed
        self.name = name
        self.slots_per_rank = layout.slots_per_rank
        self.token_offsets = StepTokenOffsets()

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        offset = self.token_offsets.take(step, layer, batch.num_tokens)
        return self.layout, cobalt.assign_node_cover(batch, self.layout, seed=self.seed,
                                                     step=step, layer=layer,
                                                     token_offset=offset)


class ScheduledLayoutSource:
    """Switches layouts on a schedule: step s uses layouts[(s // period) % len(layouts)], tasks by
    Algorithm 1 (tokens numbered per step as in :class:`FixedLayoutSource`). For exercising
    layout changes (migration, versioning) deterministically."""

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
        self.token_offsets = StepTokenOffsets()

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        layout = self.layouts[(step // self.period) % len(self.layouts)]
        offset = self.token_offsets.take(step, layer, batch.num_tokens)
        return layout, cobalt.assign_node_cover(batch, layout, seed=self.seed, step=step,
                                                layer=layer, token_offset=offset)
