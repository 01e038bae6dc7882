"""Scenarios of test_runtime_robustness.py where the ranks disagree (run by
robustness_workers.worker): checkpoints of different versions, a router or a layout source that
fails on one rank, layers built differently or run under another gradient mode on one rank, sizes
that are not the process group's. Each must raise on every rank, never hang or abort."""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np
import torch

import cobalt
from cobalt.torch import EPGroup, ExpertParallelMoE, ExpertParallelRuntime, FixedLayoutSource
from cobalt.torch.experts import TopKRouter
from robustness_workers import (E, F, H, K, LAYOUT_A, SEED, AlternatingSource, _error_of, layout,
                                micro_batch)


def _saved(module: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.getvalue()


def run_placement_disagreement(ep: EPGroup) -> dict[str, Any]:
    """Rank 0 loads an older checkpoint than the other ranks (its mains elsewhere): the next
    forward raises on every rank instead of exchanging rows under two placements."""
    rt = ExpertParallelRuntime(ep, AlternatingSource((1, 0)))  # every main moves, then again
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x = micro_batch(ep.rank, 0)[0]
    with torch.no_grad():
        moe(x)
        older = _saved(moe)
        moe(x)
    newer = _saved(moe)
    fresh_rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    fresh_rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    fresh = ExpertParallelMoE(fresh_rt, 0, H, F, E, K, seed=SEED)
    fresh.load_state_dict(torch.load(io.BytesIO(older if ep.rank == 0 else newer)))
    return {"error": _error_of(lambda: fresh(x))}


def _list_router_on_rank_1(rank: int, router: torch.nn.Module) -> Callable[[torch.Tensor], Any]:
    def route(x: torch.Tensor) -> Any:
        return ([], []) if rank == 1 else router(x)
    return route


class RaisingSource(FixedLayoutSource):
    """Raises on rank `rank` (a custom planner that crashed on one rank)."""

    def __init__(self, rank: int) -> None:
        super().__init__(layout(LAYOUT_A), seed=SEED, name="raising")
        self.rank = rank

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        if self.rank == 2:
            raise RuntimeError("planner crashed")
        return super().decide(step, layer, batch)


def run_one_rank_fails(ep: EPGroup) -> dict[str, Any]:
    """A router returning lists on rank 1, and a layout source raising on rank 2: a clear error
    on every rank, no hang; the group stays usable."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    router = TopKRouter(H, E, K, seed=SEED, layer=0)
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED,
                            router=_list_router_on_rank_1(ep.rank, router))
    x = micro_batch(ep.rank, 0)[0]
    out: dict[str, Any] = {"router": _error_of(lambda: moe(x))}
    rt2 = ExpertParallelRuntime(ep, RaisingSource(ep.rank))
    rt2.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe2 = ExpertParallelMoE(rt2, 0, H, F, E, K, seed=SEED)
    out["source"] = _error_of(lambda: moe2(x))
    out["after_shape"] = tuple(ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)(x).shape)
    return out


def run_settings_disagreement(ep: EPGroup) -> dict[str, Any]:
    """Rank 1 builds its layer with another top-k, hidden size or input dtype: every rank
    raises a ValueError naming the setting (gloo aborted every process on the exchanges' sizes);
    the group stays usable."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    odd = ep.rank == 1
    out: dict[str, Any] = {}
    top_k = 3 if odd else K
    out["top_k"] = _error_of(lambda: ExpertParallelMoE(rt, 0, H, F, E, top_k, seed=SEED)(
        micro_batch(ep.rank, 0)[0]))
    hidden = H + 1 if odd else H
    out["hidden"] = _error_of(lambda: ExpertParallelMoE(rt, 0, hidden, F, E, K, seed=SEED)(
        torch.randn(4, hidden)))
    dtype = torch.float64 if odd else torch.float32
    out["dtype"] = _error_of(lambda: ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED).to(dtype)(
        micro_batch(ep.rank, 0, dtype)[0]))
    # Gradient mode and trainable experts decide which exchanges join the backward pass.
    plain = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)

    def forward_without_grad_on_rank_1() -> None:
        with torch.set_grad_enabled(not odd):
            plain(micro_batch(ep.rank, 0)[0])
    out["no_grad"] = _error_of(forward_without_grad_on_rank_1)
    frozen = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    for p in frozen.experts.bank:
        p.requires_grad_(not odd)
    out["frozen"] = _error_of(lambda: frozen(micro_batch(ep.rank, 0)[0]))
    # A router frozen, or dense sync off, on one rank: its backward passes would skip the dense
    # gradients' all_reduce that the others run (gloo aborted the process at the next one).
    router_frozen = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    router_frozen.router.weight.requires_grad_(not odd)
    out["router_frozen"] = _error_of(lambda: router_frozen(micro_batch(ep.rank, 0)[0]))
    no_sync = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED, sync_dense_grads=not odd)
    out["no_sync"] = _error_of(lambda: no_sync(micro_batch(ep.rank, 0)[0]))
    with torch.no_grad():  # without gradients nothing is summed: no disagreement
        out["no_sync_no_grad"] = _error_of(lambda: no_sync(micro_batch(ep.rank, 0)[0]))
    # Sizes that are not the process group's (they failed at the first exchange, in gloo's words).
    out["from_sizes"] = _error_of(lambda: EPGroup.from_sizes(ep.rank, 2 * ep.world_size,
                                                             ep.ranks_per_node))
    out["after_shape"] = tuple(ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)(
        micro_batch(ep.rank, 0)[0]).shape)
    return out


SCENARIOS: dict[str, Callable[[EPGroup], dict[str, Any]]] = {
    "placement_disagreement": run_placement_disagreement,
    "one_rank_fails": run_one_rank_fails,
    "settings_disagreement": run_settings_disagreement,
}
