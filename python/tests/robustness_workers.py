"""Worker code of test_runtime_robustness.py (runs inside spawned gloo processes, 2 nodes x 2
ranks): training patterns beyond one forward and one backward per step, where the layout changes
between or during them, other dtypes, checkpoints and degenerate inputs. Saves raw results per
rank; the test process computes the single-process reference and decides."""

from __future__ import annotations

import io
import os
import traceback
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.checkpoint

import cobalt
from cobalt.torch import (EPGroup, ExpertParallelMoE, ExpertParallelRuntime, FixedLayoutSource,
                          RoutingRecorder, ScheduledLayoutSource, allreduce_gradients)
from cobalt.torch.experts import TopKRouter
from ep_workers import gather_bank_grads

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE
E, K, H, F, SEED = 8, 2, 8, 16, 7
TOKENS = [5, 3, 6, 4]  # per rank
# Two layouts in which every main instance has to move (3 slots per rank).
LAYOUT_A = [[0, 1, 4], [2, 3, 0], [4, 5, 1], [6, 7, 2]]
LAYOUT_B = [[2, 3, 6], [4, 5, 7], [6, 7, 0], [0, 1, 3]]
# Static mains plus a replica of every expert on the other node (replicas carry gradients).
REPLICATED = [[0, 1, 4, 5], [2, 3, 6, 7], [4, 5, 0, 1], [6, 7, 2, 3]]


def layout(lists: list[list[int]]) -> cobalt.ExpertLayout:
    return cobalt.ExpertLayout.from_rank_lists(cobalt.Topology(NODES, WORLD), E, len(lists[0]),
                                               lists)


class AlternatingSource:
    """Layouts by call, not by step (like a per-micro-batch policy), the same on every rank:
    call i uses sequence[i % len(sequence)] of (LAYOUT_A, LAYOUT_B). From the initial static
    placement LAYOUT_A moves no main instance, LAYOUT_B moves every one."""

    name = "alternating"

    def __init__(self, sequence: tuple[int, ...] = (0, 1)) -> None:
        self.layouts = [layout(LAYOUT_A), layout(LAYOUT_B)]
        self.sequence = sequence
        self.slots_per_rank = 3
        self.calls = 0

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        chosen = self.layouts[self.sequence[self.calls % len(self.sequence)]]
        self.calls += 1
        return chosen, cobalt.assign_node_cover(batch, chosen, seed=SEED, step=step, layer=layer)


def micro_batch(rank: int, index: int, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, target) of a rank's micro-batch `index`, reproducible in the test process."""
    g = torch.Generator().manual_seed(131 * index + rank)
    n = TOKENS[rank]
    return torch.randn(n, H, generator=g).to(dtype), torch.randn(n, H, generator=g).to(dtype)


def vacant_grad_sum(moe: ExpertParallelMoE) -> float:
    """Sum of |grad| over bank slots that hold no main instance (must be 0; a collective)."""
    store = moe.experts
    used = {int(store.main_slot[e]) for e in store.local_experts()}
    total = 0.0
    for p in store.bank:
        if p.grad is not None:
            for s in range(store.capacity):
                if s not in used:
                    total += float(p.grad[s].abs().sum())
    t = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def moves(moe: ExpertParallelMoE) -> int:
    c = moe.experts.counters
    return c.main_moves_cross_node + c.main_moves_intra_node


# ---------------------------------------------------------------------------------- scenarios
def run_accumulation(ep: EPGroup) -> dict[str, Any]:
    """Two micro-batches with a backward pass each, the layout changing before the second: the
    accumulated expert gradients move with their experts, the router's sum once per pass."""
    rt = ExpertParallelRuntime(ep, AlternatingSource())
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    moved = []
    for index in range(2):
        x, target = micro_batch(ep.rank, index)
        (moe(x) * target).sum().backward()
        moved.append(moves(moe))
    return {"grads": gather_bank_grads(moe), "router": moe.router.weight.grad.clone(),
            "vacant": vacant_grad_sum(moe), "moves": moved}


def run_two_forwards(ep: EPGroup) -> dict[str, Any]:
    """Two forwards summed into one loss: the second forward's layout must not move mains under
    the first forward's pending backward; the change lands at the next forward."""
    rt = ExpertParallelRuntime(ep, AlternatingSource((0, 1, 1)))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    loss = torch.zeros(())
    for index in range(2):
        x, target = micro_batch(ep.rank, index)
        loss = loss + (moe(x) * target).sum()
    moved_before = moves(moe)
    loss.backward()
    grads = gather_bank_grads(moe)
    deferred = moe.experts.counters.deferred
    with torch.no_grad():  # nothing pending now: LAYOUT_B, asked for again, applies
        moe(micro_batch(ep.rank, 2)[0])
    return {"grads": grads, "router": moe.router.weight.grad.clone(), "moves_before": moved_before,
            "deferred": deferred, "moves_after": moves(moe), "versions": moe.experts.version}


def run_retained_graph(ep: EPGroup) -> dict[str, Any]:
    """Two backward passes through one forward (a main and an auxiliary loss)."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(REPLICATED), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x, target = micro_batch(ep.rank, 0)
    y = moe(x)
    (y * target).sum().backward(retain_graph=True)
    (y ** 2).sum().backward()
    return {"grads": gather_bank_grads(moe), "router": moe.router.weight.grad.clone(),
            "replicas": rt.records[-1].num_replicas}


def run_float64(ep: EPGroup) -> dict[str, Any]:
    """A float64 layer with Adam, every main moving at every step, against the same training on
    a fixed layout: migrations must carry float64 parameters and optimizer state exactly."""
    out: dict[str, Any] = {}
    for name, source in (("moving", ScheduledLayoutSource([layout(LAYOUT_A), layout(LAYOUT_B)],
                                                          1, seed=SEED)),
                         ("fixed", FixedLayoutSource(layout(LAYOUT_A), seed=SEED))):
        rt = ExpertParallelRuntime(ep, source)
        moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED).to(torch.float64)
        moe.router.weight.requires_grad_(False)  # the same routing in both runs
        opt = torch.optim.Adam(moe.expert_parameters(), lr=1e-2)
        rt.attach_optimizer(opt)
        for step in range(4):
            x, target = micro_batch(ep.rank, step, torch.float64)
            ((moe(x) - target) ** 2).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rt.end_step()
        c = moe.experts.counters
        out[name] = {"weights": list(moe.gather_expert_weights()), "rollbacks": c.rollbacks,
                     "versions": moe.experts.version, "moves": moves(moe)}
    return out


def run_empty_step(ep: EPGroup) -> dict[str, Any]:
    """A step in which no rank has a token (forward and backward), then a normal one."""
    rt = ExpertParallelRuntime(ep, AlternatingSource())
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x = torch.zeros(0, H, requires_grad=True)
    y = moe(x)
    y.sum().backward()
    rt.end_step()
    z = moe(micro_batch(ep.rank, 0)[0])
    return {"empty_shape": tuple(y.shape), "after_shape": tuple(z.shape)}


def run_dtype_mismatch(ep: EPGroup) -> dict[str, Any]:
    """A float64 input on one rank (an fp32 layer) raises on every rank; the group stays usable."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x = micro_batch(ep.rank, 0)[0]
    if ep.rank == 0:
        x = x.double()
    out: dict[str, Any] = {"error": None}
    try:
        moe(x)
    except ValueError as exc:
        out["error"] = str(exc)
    out["after_shape"] = tuple(moe(micro_batch(ep.rank, 1)[0]).shape)
    return out


def run_checkpoint(ep: EPGroup) -> dict[str, Any]:
    """state_dict after layout changes, loaded into a fresh layer: the same experts, rows and
    placement; a bank of another capacity refuses it."""
    def build(slots: int = 3) -> tuple[ExpertParallelRuntime, ExpertParallelMoE]:
        if slots == 3:
            source = ScheduledLayoutSource([layout(LAYOUT_A), layout(LAYOUT_B)], 1, seed=SEED)
        else:
            source = FixedLayoutSource(layout(REPLICATED), seed=SEED)
        rt = ExpertParallelRuntime(ep, source)
        rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
        return rt, ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)

    rt, moe = build()
    for step in range(2):  # step 1 applies LAYOUT_B: every main moves
        x, target = micro_batch(ep.rank, step)
        (moe(x) * target).sum().backward()
        rt.end_step()
    buffer = io.BytesIO()
    torch.save(moe.state_dict(), buffer)
    saved = buffer.getvalue()
    _, fresh = build()
    fresh.load_state_dict(torch.load(io.BytesIO(saved)))
    out: dict[str, Any] = {
        "before": list(moe.gather_expert_weights()), "after": list(fresh.gather_expert_weights()),
        "main_rank": [moe.experts.main_rank.copy(), fresh.experts.main_rank.copy()],
        "moves": moves(moe), "capacity_error": None}
    _, other = build(slots=4)
    try:
        other.load_state_dict(torch.load(io.BytesIO(saved)))
    except (ValueError, RuntimeError) as exc:
        out["capacity_error"] = str(exc)
    return out


def run_auxiliary_pass(ep: EPGroup) -> dict[str, Any]:
    """A backward pass that reaches the router but no MoE output (an auxiliary router loss on its
    own), then zero_grad: the next step's router gradient must equal a run without it."""
    out: dict[str, Any] = {}
    for variant in ("clean", "aux_then_zero"):
        rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
        rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
        moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
        x0, target0 = micro_batch(ep.rank, 0)
        (moe(x0) * target0).sum().backward()
        if variant == "aux_then_zero":
            _, gates = moe.router(x0)
            gates.sum().backward()
        moe.zero_grad(set_to_none=variant == "clean")
        rt.end_step()
        x1, target1 = micro_batch(ep.rank, 1)
        (moe(x1) * target1).sum().backward()
        out[variant] = moe.router.weight.grad.clone()
    return out


def run_retained_then_migrate(ep: EPGroup) -> dict[str, Any]:
    """A retained graph keeps main instances in place until its last backward pass: forward 0,
    backward with retain_graph, forward 1 asks for a layout moving every main, backward through
    graph 0 again, backward 1."""
    rt = ExpertParallelRuntime(ep, AlternatingSource((0, 1)))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x0, target0 = micro_batch(ep.rank, 0)
    loss0 = (moe(x0) * target0).sum()
    loss0.backward(retain_graph=True)
    x1, target1 = micro_batch(ep.rank, 1)
    y1 = moe(x1)
    moved = moves(moe)
    loss0.backward()
    (y1 * target1).sum().backward()
    return {"grads": gather_bank_grads(moe), "router": moe.router.weight.grad.clone(),
            "moves_under_graph": moved, "deferred": moe.experts.counters.deferred,
            "vacant": vacant_grad_sum(moe)}


def run_forwards_without_backward(ep: EPGroup) -> dict[str, Any]:
    """Forwards with autograd on whose outputs are dropped (evaluation without no_grad) leave no
    backward window open, so layout changes are not held back."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    for index in range(20):
        moe(micro_batch(ep.rank, index)[0])
    return {"open_windows": len(moe.experts._pending)}


def run_checkpoint_loading(ep: EPGroup) -> dict[str, Any]:
    """A state_dict loads with torch.load(weights_only=True); one written for another world size
    is refused before anything is copied."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    buffer = io.BytesIO()
    torch.save(moe.state_dict(), buffer)
    out: dict[str, Any] = {"weights_only": None, "refused": None}
    try:
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - reported
        out["weights_only"] = f"{type(exc).__name__}: {exc}"
    before = moe.experts.w1.detach().clone()
    router_before = moe.router.weight.detach().clone()
    state = {k: (v + 1.0 if torch.is_tensor(v) and v.is_floating_point() else v)
             for k, v in moe.state_dict().items()}
    extra = dict(state["experts._extra_state"])
    extra["world_size"] = 2 * WORLD
    state["experts._extra_state"] = extra
    try:
        moe.load_state_dict(state)
    except ValueError as exc:
        out["refused"] = str(exc)
    out["bank_unchanged"] = bool(torch.equal(moe.experts.w1.detach(), before))
    # The router is loaded before the experts: the layer checks their placement first.
    out["router_unchanged"] = bool(torch.equal(moe.router.weight.detach(), router_before))
    # Not while a forward waits for its backward pass (it holds views of the bank rows): refused
    # before anything is loaded, and the pass then runs; between steps it loads.
    saved = moe.state_dict()
    y = moe(micro_batch(ep.rank, 0)[0])
    try:
        moe.load_state_dict({k: (v + 1.0 if torch.is_tensor(v) and v.is_floating_point() else v)
                             for k, v in saved.items()})
        out["refused_pending"] = None
    except ValueError as exc:
        out["refused_pending"] = str(exc)
    out["unchanged_pending"] = bool(torch.equal(moe.experts.w1.detach(), before)) and bool(
        torch.equal(moe.router.weight.detach(), router_before))
    y.sum().backward()
    moe.load_state_dict({k: (v + 1.0 if torch.is_tensor(v) and v.is_floating_point() else v)
                         for k, v in saved.items()})
    out["loaded_after"] = bool(torch.equal(moe.experts.w1.detach(), before + 1.0))
    return out


def run_recorder_empty_step(ep: EPGroup) -> dict[str, Any]:
    """The routing recorder over a step in which no rank has a token, then a normal one."""
    router = TopKRouter(H, E, K, seed=SEED)
    recorder = RoutingRecorder(E, K, ep=ep)
    recorder.attach(router, 0)
    router(torch.zeros(0, H))
    recorder.end_step()
    router(micro_batch(ep.rank, 0)[0])
    recorder.end_step()
    data = recorder.trace_data()
    return {"num_steps": recorder.num_steps, "num_tokens": int(np.asarray(data.topk_ids).shape[1])}


def run_activation_checkpointing(ep: EPGroup) -> dict[str, Any]:
    """Two stacked layers, two steps, the layouts changing at every step (every main of layer 0
    moves at step 1), without checkpointing and inside torch.utils.checkpoint (reentrant and
    not): the recomputed forwards must replay the original decisions (the source asked once per
    forward, records once) and give the same gradients."""
    out: dict[str, Any] = {}
    for mode in ("none", "reentrant", "non_reentrant"):
        source = AlternatingSource((0, 1, 1, 0))  # layer 0: A then B; layer 1: B then A
        rt = ExpertParallelRuntime(ep, source)
        rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
        layers = [ExpertParallelMoE(rt, layer, H, F, E, K, seed=SEED) for layer in range(2)]
        x_grads = []
        for step in range(2):
            x, target = micro_batch(ep.rank, step)
            x.requires_grad_(True)
            h = x
            for moe in layers:
                if mode == "none":
                    h = h + moe(h)
                else:
                    h = h + torch.utils.checkpoint.checkpoint(
                        moe, h, use_reentrant=mode == "reentrant")
            (h * target).sum().backward()
            x_grads.append(x.grad.clone())
            rt.end_step()
        out[mode] = {
            "calls": source.calls, "records": len(rt.records),
            "replayed": sum(m.num_recomputed for m in layers),
            "moves": sum(moves(m) for m in layers),
            "grads": [gather_bank_grads(m) for m in layers],
            "router": [m.router.weight.grad.clone() for m in layers],
            "x_grads": x_grads,
        }
    return out


def run_checkpointed_micro_batches(ep: EPGroup) -> dict[str, Any]:
    """Five checkpointed (non-reentrant) forwards into one backward, the layout alternating
    per call (more forwards than a small cache would hold; every recomputation must replay its
    own forward's decision), against the plain run; then the same batch twice in one step with
    two different decisions: the recomputation cannot tell them apart and raises on every rank
    (not a hang, not a silent wrong replay)."""
    out: dict[str, Any] = {}
    for mode in ("none", "non_reentrant"):
        rt = ExpertParallelRuntime(ep, AlternatingSource((0, 1)))
        rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
        moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
        loss = torch.zeros(())
        for index in range(5):
            x, target = micro_batch(ep.rank, index)
            x.requires_grad_(True)
            y = moe(x) if mode == "none" else torch.utils.checkpoint.checkpoint(
                moe, x, use_reentrant=False)
            loss = loss + (y * target).sum()
        loss.backward()
        out[mode] = {"grads": gather_bank_grads(moe), "replayed": moe.num_recomputed}
    rt = ExpertParallelRuntime(ep, AlternatingSource((0, 1)))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x, target = micro_batch(ep.rank, 0)
    loss = torch.zeros(())
    for _ in range(2):
        xi = x.clone().requires_grad_(True)
        loss = loss + (torch.utils.checkpoint.checkpoint(moe, xi, use_reentrant=False)
                       * target).sum()
    try:
        loss.backward()
        out["ambiguous_error"] = None
    except RuntimeError as exc:
        out["ambiguous_error"] = str(exc)
    return out


def run_frozen_experts(ep: EPGroup) -> dict[str, Any]:
    """Frozen expert weights get no gradient and do not move under the optimizer: a fully frozen
    bank (AdamW with weight decay, the router training) and a frozen w2 only, with replicas on
    every rank (their gradients return to the mains), trained with SGD."""
    out: dict[str, Any] = {}
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(REPLICATED), seed=SEED))
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    for p in moe.expert_parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(moe.parameters(), lr=1e-2, weight_decay=0.1)
    rt.attach_optimizer(opt)
    bank = [p.detach().clone() for p in moe.expert_parameters()]
    router = moe.router.weight.detach().clone()
    x, target = micro_batch(ep.rank, 0)
    (moe(x) * target).sum().backward()
    allreduce_gradients(moe.expert_parameters(), ep.group)  # requires no grad: skipped
    grads = [p.grad is not None for p in moe.expert_parameters()]
    opt.step()
    out["all_frozen"] = {
        "grads": grads,
        "bank_changed": [not torch.equal(a, p.detach())
                         for a, p in zip(bank, moe.expert_parameters())],
        "router_changed": not torch.equal(router, moe.router.weight.detach())}

    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(REPLICATED), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    moe.experts.w2.requires_grad_(False)
    opt = torch.optim.SGD(moe.parameters(), lr=0.1, weight_decay=0.1)
    w2 = moe.experts.w2.detach().clone()
    (moe(x) * target).sum().backward()
    out["w2_frozen"] = {"w2_grad": moe.experts.w2.grad is not None,
                        "grads": gather_bank_grads(moe)}
    opt.step()
    out["w2_frozen"]["w2_changed"] = not torch.equal(w2, moe.experts.w2.detach())
    return out


def run_auxiliary_after_main(ep: EPGroup) -> dict[str, Any]:
    """Router-only backward passes (an auxiliary loss on the gates, backpropagated on its own)
    before and after the MoE's backward pass: each is summed over the ranks at its own end, so
    the router gradient is the same on every rank when the optimizer steps."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x, target = micro_batch(ep.rank, 0)
    _, gates = moe.router(x)
    (gates ** 2).sum().backward()           # before the MoE pass
    (moe(x) * target).sum().backward()      # the MoE pass
    _, gates = moe.router(x)
    (gates ** 2).sum().backward()           # after it
    return {"router": moe.router.weight.grad.clone()}


def run_device_mismatch(ep: EPGroup) -> dict[str, Any]:
    """The runtime runs CPU tensors only: an input, a router output or an expert bank on another
    device (here "meta") on one rank raises a ValueError naming the device on every rank, before
    any exchange; the group stays usable."""
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(layout(LAYOUT_A), seed=SEED))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x = micro_batch(ep.rank, 0)[0]
    out: dict[str, Any] = {}

    def attempt(name: str, layer: ExpertParallelMoE, inp: torch.Tensor) -> None:
        try:
            layer(inp)
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)

    attempt("input", moe, x.to("meta") if ep.rank == 0 else x)
    meta_router = ExpertParallelMoE(
        rt, 0, H, F, E, K, seed=SEED,
        router=lambda z: tuple(t.to("meta") if ep.rank == 2 else t for t in moe.router(z)))
    attempt("router", meta_router, x)
    meta_bank = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    if ep.rank == 1:
        meta_bank.experts.to("meta")
    attempt("bank", meta_bank, x)
    out["after_shape"] = tuple(moe(x).shape)
    return out


class FlatExecRankSource(FixedLayoutSource):
    """Returns exec_rank flattened to [T * K] (a custom source's mistake)."""

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        chosen, exec_rank = super().decide(step, layer, batch)
        return chosen, np.asarray(exec_rank).ravel()


class CastExecRankSource(FixedLayoutSource):
    """Returns exec_rank through `cast` (float ranks 0.9 above the right ones, or ranks 2^32 above
    them: a cast to int32 would truncate or wrap both back to the right ranks, silently)."""

    def __init__(self, *args: Any, cast: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cast = cast

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch
               ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        chosen, exec_rank = super().decide(step, layer, batch)
        return chosen, self.cast(np.asarray(exec_rank))


def run_bad_exec_rank(ep: EPGroup) -> dict[str, Any]:
    """A layout source whose exec_rank is not [T, K], or not integers in [0, G), is refused with
    a clear error."""
    sources = {
        "error": FlatExecRankSource(layout(LAYOUT_A), seed=SEED, name="flat"),
        "float_error": CastExecRankSource(layout(LAYOUT_A), seed=SEED, name="float",
                                          cast=lambda r: r + 0.9),
        "wrapped_error": CastExecRankSource(layout(LAYOUT_A), seed=SEED, name="wrapped",
                                            cast=lambda r: r.astype(np.int64) + 2**32),
    }
    out: dict[str, Any] = {}
    for key, source in sources.items():
        rt = ExpertParallelRuntime(ep, source)
        rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
        moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
        try:
            moe(micro_batch(ep.rank, 0)[0])
            out[key] = None
        except ValueError as exc:
            out[key] = str(exc)
    return out


def run_inference_mode(ep: EPGroup) -> dict[str, Any]:
    """A forward under torch.inference_mode() runs as under no_grad (same output), also when it
    applies a layout change; training continues after it."""
    rt = ExpertParallelRuntime(ep, ScheduledLayoutSource([layout(LAYOUT_A), layout(LAYOUT_B)], 1,
                                                         seed=SEED))
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    opt = torch.optim.Adam(moe.parameters(), lr=1e-2)
    rt.attach_optimizer(opt)
    x, target = micro_batch(ep.rank, 0)
    (moe(x) * target).sum().backward()
    opt.step()
    opt.zero_grad()
    rt.end_step()
    with torch.inference_mode():  # step 1: LAYOUT_B, every main moves
        y_inference = moe(x)
    with torch.no_grad():
        y_no_grad = moe(x)
    (moe(x) * target).sum().backward()
    opt.step()
    return {"equal": bool(torch.equal(y_inference, y_no_grad)),
            "inference_tensor": y_inference.is_inference(), "moves": moves(moe),
            "rollbacks": moe.experts.counters.rollbacks}


def _error_of(fn: Callable[[], Any]) -> Optional[str]:
    """`type: message` of what fn() raised, or None."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"{type(exc).__name__}: {exc}"
    return None


def run_optimizer_declaration(ep: EPGroup) -> dict[str, Any]:
    """Mains of a trainable bank do not move before the optimizer is declared, nor with an
    optimizer that does not hold the bank: a clear error on every rank, nothing moved; with the
    right optimizer they move."""
    rt = ExpertParallelRuntime(ep, AlternatingSource((0, 1, 1, 1)))
    moe = ExpertParallelMoE(rt, 0, H, F, E, K, seed=SEED)
    x, target = micro_batch(ep.rank, 0)
    (moe(x) * target).sum().backward()  # LAYOUT_A: no main moves
    bank_before = [p.detach().clone() for p in moe.experts.bank]
    grads_before = [p.grad.clone() for p in moe.experts.bank]
    placement_before = moe.experts.placement_digest()
    out: dict[str, Any] = {"unattached": _error_of(lambda: moe(x))}  # LAYOUT_B: all would move
    rt.attach_optimizer(torch.optim.Adam(moe.router.parameters(), lr=1e-2))
    out["wrong_optimizer"] = _error_of(lambda: moe(x))
    out["unchanged"] = (
        all(torch.equal(a, p) for a, p in zip(bank_before, moe.experts.bank))
        and all(torch.equal(a, p.grad) for a, p in zip(grads_before, moe.experts.bank))
        and placement_before == moe.experts.placement_digest() and moves(moe) == 0)
    out["not_an_optimizer"] = _error_of(lambda: rt.attach_optimizer(moe))  # type: ignore[arg-type]
    rt.attach_optimizer(torch.optim.Adam(moe.parameters(), lr=1e-2))
    moe(x)
    out["moves"] = moves(moe)
    return out


SCENARIOS: dict[str, Callable[[EPGroup], dict[str, Any]]] = {
    "accumulation": run_accumulation,
    "two_forwards": run_two_forwards,
    "retained_graph": run_retained_graph,
    "float64": run_float64,
    "empty_step": run_empty_step,
    "dtype_mismatch": run_dtype_mismatch,
    "checkpoint": run_checkpoint,
    "auxiliary_pass": run_auxiliary_pass,
    "retained_then_migrate": run_retained_then_migrate,
    "forwards_without_backward": run_forwards_without_backward,
    "checkpoint_loading": run_checkpoint_loading,
    "recorder_empty_step": run_recorder_empty_step,
    "activation_checkpointing": run_activation_checkpointing,
    "checkpointed_micro_batches": run_checkpointed_micro_batches,
    "frozen_experts": run_frozen_experts,
    "auxiliary_after_main": run_auxiliary_after_main,
    "device_mismatch": run_device_mismatch,
    "bad_exec_rank": run_bad_exec_rank,
    "inference_mode": run_inference_mode,
    "optimizer_declaration": run_optimizer_declaration,
}


def worker(rank: int, world: int, out_dir: str) -> None:
    """Runs every scenario, these and disagreement_workers.py's (ranks that disagree); saves
    {out_dir}/rank{rank}.pt with results or the failure text."""
    # Imported here: disagreement_workers imports this module's helpers.
    from disagreement_workers import SCENARIOS as DISAGREEMENT_SCENARIOS
    ep = EPGroup.create(RANKS_PER_NODE)
    result: dict[str, Any] = {"failures": {}}
    for name, fn in {**SCENARIOS, **DISAGREEMENT_SCENARIOS}.items():
        try:
            result[name] = fn(ep)
        except Exception:  # noqa: BLE001 - reported by the test process
            result["failures"][name] = traceback.format_exc()
            torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
            raise
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
