"""Worker code of the multi-process tests (runs inside spawned gloo processes).

One launch per topology runs every scenario in sequence and saves raw results per rank
(torch.save); the pytest process then computes the single-process reference and compares, so
nothing here decides whether a test passes.
"""

from __future__ import annotations

import io
import os
import traceback
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

import cobalt
from cobalt.torch import (
    EPGroup,
    ExpertParallelMoE,
    ExpertParallelRuntime,
    FixedLayoutSource,
    PolicyLayoutSource,
    RoutingRecorder,
    ScheduledLayoutSource,
)
from cobalt.torch.all_to_all import exchange_rows
from cobalt.torch.reduce import all_reduce_sum_

CHANNELS = ["dispatch.fwd", "dispatch_gates.fwd", "combine.fwd", "dispatch.bwd",
            "dispatch_gates.bwd", "combine.bwd", "replica_params.fwd", "replica_grads.bwd"]


@dataclass(frozen=True)
class Sizes:
    """Model sizes of one topology's suite."""

    hidden: int
    ffn: int
    num_experts: int
    top_k: int
    seed: int = 7
    equivalence_steps: int = 3
    training_steps: int = 30
    relayout_period: int = 5


def tokens_of(rank: int, step: int) -> int:
    """Tokens of rank `rank` at `step`: uneven, sometimes zero."""
    return (3 + 5 * rank + 2 * step) % 9


def batch_of(rank: int, step: int, hidden: int, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T_r, H], target [T_r, H]) of a rank at a step, reproducible in the test process."""
    g = torch.Generator().manual_seed(100_003 * salt + 1_009 * step + rank)
    n = tokens_of(rank, step)
    return torch.randn(n, hidden, generator=g), torch.randn(n, hidden, generator=g)


def replicated_layout(topology: cobalt.Topology, num_experts: int, slots: int) -> cobalt.ExpertLayout:
    """Static EP plus many replicas: expert 0 on every rank, expert 1 on one rank per node, the
    rest of the free slots filled round-robin."""
    g = topology.num_ranks
    m = topology.ranks_per_node
    lists = [[e for e in range(num_experts) if e * g // num_experts == r] for r in range(g)]
    for r in range(g):
        if 0 not in lists[r]:
            lists[r].append(0)
        if r % m == m - 1 and 1 not in lists[r]:
            lists[r].append(1)
    nxt = 2
    for r in range(g):
        while len(lists[r]) < slots:
            e = nxt % num_experts
            nxt += 1
            if e not in lists[r]:
                lists[r].append(e)
    return cobalt.ExpertLayout.from_rank_lists(topology, num_experts, slots, lists)


def random_layouts(topology: cobalt.Topology, num_experts: int, slots: int, count: int,
                   seed: int) -> list[cobalt.ExpertLayout]:
    """`count` different layouts with replicas: experts dealt to ranks in a random order (mains
    must move, across and inside nodes), then random extra replicas."""
    rng = np.random.default_rng(seed)
    g = topology.num_ranks
    out = []
    for _ in range(count):
        perm = rng.permutation(num_experts)
        lists: list[list[int]] = [[] for _ in range(g)]
        for i, e in enumerate(perm):
            lists[i * g // num_experts].append(int(e))
        for r in range(g):
            extra = [int(e) for e in rng.permutation(num_experts) if int(e) not in lists[r]]
            lists[r] += extra[: slots - len(lists[r])]
        out.append(cobalt.ExpertLayout.from_rank_lists(topology, num_experts, slots, lists))
    return out


def make_source(case: str, ep: EPGroup, sz: Sizes, num_layers: int = 1,
                period: Optional[int] = None) -> Any:
    topo = ep.topology
    slots = cobalt.slots_for_rho(sz.num_experts, ep.world_size, 0.5)
    if case == "replicated":  # two extra slots per rank: room for many replicas
        return FixedLayoutSource(replicated_layout(topo, sz.num_experts, slots + 2),
                                 seed=sz.seed, name=case)
    if case == "scheduled":
        layouts = random_layouts(topo, sz.num_experts, slots, 3, sz.seed)
        return ScheduledLayoutSource(layouts, period or sz.relayout_period, seed=sz.seed,
                                     name=case)
    extra: dict[str, Any] = {}
    if case == "cobalt" and period is not None:
        extra = {"steps_per_global_plan": period, "async_planning": True}
    return PolicyLayoutSource(case, topo, sz.num_experts, sz.top_k, num_layers=num_layers,
                              slots_per_rank=slots, hidden=sz.hidden, ffn=sz.ffn, seed=sz.seed,
                              **extra)


def gather_bank_grads(moe: ExpertParallelMoE) -> list[torch.Tensor]:
    """Every expert's main-instance gradient [E, ...] on every rank (a collective)."""
    store = moe.experts
    out = [torch.zeros((store.num_experts,) + tuple(p.shape[1:]), dtype=p.dtype)
           for p in store.bank]
    for e in store.local_experts():
        for o, p in zip(out, store.bank):
            if p.grad is not None:
                o[int(e)] = p.grad[int(store.main_slot[e])]
    for o in out:
        all_reduce_sum_(o)  # bf16 too (gloo cannot all_reduce it directly)
    return out


# ---------------------------------------------------------------------------------- scenarios
def run_equivalence(ep: EPGroup, case: str, sz: Sizes, out_dir: str) -> dict[str, Any]:
    """Forward + backward for a few steps (no optimizer: weights fixed), recording outputs,
    gradients, routing, layouts and traffic."""
    rt = ExpertParallelRuntime(ep, make_source(case, ep, sz))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, sz.hidden, sz.ffn, sz.num_experts, sz.top_k, seed=sz.seed)
    recorder = None
    if case == "cobalt":
        recorder = RoutingRecorder(sz.num_experts, sz.top_k, ep=ep,
                                   metadata={"model": "ep-test", "dataset": "random"})
        recorder.attach(moe.router, 0)  # type: ignore[arg-type]
    steps = []
    for step in range(sz.equivalence_steps):
        x, target = batch_of(ep.rank, step, sz.hidden)
        y_no_grad = None
        if case == "replicated":  # an inference forward of the same step, the same routing:
            with torch.no_grad():  # the source decides the same, so the outputs are bitwise equal
                y_no_grad = moe(x)
        x.requires_grad_(True)
        rt.traffic.reset()
        y = moe(x)
        fwd = rt.traffic.global_totals(ep.group, CHANNELS)
        (y * target).sum().backward()
        both = rt.traffic.global_totals(ep.group, CHANNELS)
        rec = rt.records[-1]
        steps.append({
            "y": y.detach().clone(),
            "y_no_grad": y_no_grad,
            "x_grad": x.grad.clone() if x.grad is not None else torch.zeros_like(x),
            "router_grad": moe.router.weight.grad.clone(),  # type: ignore[union-attr]
            "expert_grads": gather_bank_grads(moe),
            "topk_ids": moe.last_topk_ids.copy(),
            "exec_rank": moe.last_exec_rank.copy(),
            "slots": np.array(moe.last_layout.slots),
            "main_rank": moe.experts.main_rank.copy(),
            "num_replicas": rec.num_replicas,
            "cross_node_tokens": rec.cross_node_tokens,
            "traffic_fwd": {k: vars(v) for k, v in fwd.items()},
            "traffic": {k: vars(v) for k, v in both.items()},
        })
        moe.zero_grad(set_to_none=True)
        if recorder is not None:
            recorder.end_step()
        rt.end_step()
    if recorder is not None:
        recorder.write(os.path.join(out_dir, "recorded.safetensors"))
    return {"steps": steps, "versions": moe.experts.version}


class TwoLayerModel(nn.Module):
    """y = x + moe0(x) + moe1(x) with frozen routers: the routing is then the same in every run,
    so runs differ only by floating-point summation order (a trainable router would turn
    last-bit differences into different top-k choices)."""

    def __init__(self, rt: ExpertParallelRuntime, sz: Sizes) -> None:
        super().__init__()
        self.moes = nn.ModuleList([
            ExpertParallelMoE(rt, layer, sz.hidden, sz.ffn, sz.num_experts, sz.top_k,
                              seed=sz.seed) for layer in range(2)])
        for moe in self.moes:
            moe.router.weight.requires_grad_(False)  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moes[0](x) + self.moes[1](x)


def run_training(ep: EPGroup, mode: str, sz: Sizes, fault_at_version: int = 0,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Adam for sz.training_steps steps with the model, inputs and targets in `dtype`; returns
    final main weights of both layers and what the layout changes did. fault_at_version > 0
    corrupts the first migrated row when layer 0 applies that version (on every rank that
    receives rows), to exercise the rollback. In bfloat16 the trained state_dict is also loaded
    into a fresh model on the static layout ("loaded": its main weights)."""
    source = make_source(mode, ep, sz, num_layers=2, period=sz.relayout_period)
    rt = ExpertParallelRuntime(ep, source)
    model = TwoLayerModel(rt, sz).to(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    rt.attach_optimizer(opt)
    faults = {"done": False}

    def corrupt(stage: str, rows: torch.Tensor) -> None:
        store = model.moes[0].experts
        if not faults["done"] and store.version + 1 == fault_at_version:
            faults["done"] = True
            if rows.shape[0] > 0:
                rows[0, 0] ^= 1  # rows are raw bytes: flip one bit

    if fault_at_version > 0:
        model.moes[0].experts.fault_hook = corrupt
    for step in range(sz.training_steps):
        x, target = (t.to(dtype) for t in batch_of(ep.rank, step, sz.hidden, salt=1))
        loss = ((model(x) - target) ** 2).float().sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rt.end_step()
    out = {
        "weights": [list(moe.gather_expert_weights()) for moe in model.moes],
        "counters": [vars(moe.experts.counters).copy() for moe in model.moes],
        "versions": [moe.experts.version for moe in model.moes],
        "max_replicas": max(r.num_replicas for r in rt.records),
        "cross_node_tokens": sum(r.cross_node_tokens for r in rt.records),
        "main_rank": [moe.experts.main_rank.copy() for moe in model.moes],
    }
    if dtype == torch.bfloat16:
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        fresh = TwoLayerModel(
            ExpertParallelRuntime(ep, make_source("static", ep, sz, num_layers=2)), sz).to(dtype)
        fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        out["loaded"] = [list(moe.gather_expert_weights()) for moe in fresh.moes]
    return out


def run_errors(ep: EPGroup, sz: Sizes) -> dict[str, Any]:
    """Bad inputs must raise on every rank (and leave the group usable)."""
    out: dict[str, Any] = {}
    try:
        EPGroup.create(ranks_per_node=3)
        out["world_size"] = None
    except ValueError as exc:
        out["world_size"] = str(exc)

    rt = ExpertParallelRuntime(ep, make_source("static", ep, sz))
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    good = ExpertParallelMoE(rt, 0, sz.hidden, sz.ffn, sz.num_experts, sz.top_k, seed=sz.seed)

    def bad_router(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, gates = good.router(x)  # type: ignore[operator]
        if ep.rank == 1 and ids.shape[0] > 0:
            ids = ids.clone()
            ids[0, 0] = sz.num_experts  # out of range, on one rank only
        return ids, gates

    bad = ExpertParallelMoE(rt, 0, sz.hidden, sz.ffn, sz.num_experts, sz.top_k, seed=sz.seed,
                            router=bad_router)
    x = torch.randn(4, sz.hidden)
    try:
        bad(x)
        out["bad_ids"] = None
    except ValueError as exc:
        out["bad_ids"] = str(exc)
    wrong = torch.randn(4, sz.hidden + (1 if ep.rank == ep.world_size - 1 else 0))
    try:
        good(wrong)
        out["bad_shape"] = None
    except ValueError as exc:
        out["bad_shape"] = str(exc)
    # The group still works after the errors.
    y = good(torch.randn(3, sz.hidden))
    out["after_ok"] = tuple(y.shape)
    return out


def suite_worker(rank: int, world: int, ranks_per_node: int, out_dir: str, sz: Sizes,
                 cases: list[str], training_modes: list[str]) -> None:
    """Runs every scenario; saves {out_dir}/rank{rank}.pt (and error text instead of dying, so
    the tests can report which scenario failed)."""
    ep = EPGroup.create(ranks_per_node)
    result: dict[str, Any] = {"errors": None, "equivalence": {}, "training": {}, "failures": {}}

    def attempt(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - reported to the test process
            result["failures"][name] = traceback.format_exc()
            raise

    result["errors"] = attempt("errors", lambda: run_errors(ep, sz))
    for case in cases:
        result["equivalence"][case] = attempt(case, lambda: run_equivalence(ep, case, sz,
                                                                            out_dir))
    for mode in training_modes:
        fault = 2 if mode == "scheduled" else 0
        result["training"][mode] = attempt(f"training-{mode}",
                                           lambda: run_training(ep, mode, sz, fault))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


# ---------------------------------------------------------------------------------- bfloat16
def run_bf16_equivalence(ep: EPGroup, case: str, sz: Sizes) -> list[dict[str, Any]]:
    """run_equivalence's forward + backward with the layer, its inputs and its targets in
    bfloat16 (the scheduled case changes the layout every step, so main instances migrate)."""
    source = make_source(case, ep, sz, period=1) if case == "scheduled" else make_source(
        case, ep, sz)
    rt = ExpertParallelRuntime(ep, source)
    rt.attach_optimizer(None)  # no optimizer: nothing to move with mains
    moe = ExpertParallelMoE(rt, 0, sz.hidden, sz.ffn, sz.num_experts, sz.top_k,
                            seed=sz.seed).to(torch.bfloat16)
    steps = []
    for step in range(sz.equivalence_steps):
        x, target = (t.to(torch.bfloat16) for t in batch_of(ep.rank, step, sz.hidden))
        x.requires_grad_(True)
        y = moe(x)
        (y * target).sum().backward()
        steps.append({
            "y": y.detach().clone(),
            "x_grad": x.grad.clone() if x.grad is not None else torch.zeros_like(x),
            "router_grad": moe.router.weight.grad.clone(),  # type: ignore[union-attr]
            "expert_grads": gather_bank_grads(moe),
            "main_weights": list(moe.gather_expert_weights()),
            "num_replicas": rt.records[-1].num_replicas,
            "version": moe.experts.version,
        })
        moe.zero_grad(set_to_none=True)
        rt.end_step()
    return steps


def run_bf16_exchange_rows(rank: int, world: int) -> dict[str, torch.Tensor]:
    """exchange_rows on bfloat16 rows of 1, 2 and 3 dimensions: rank r sends r + d + 1 rows to
    rank d, each row's values naming (sender, receiver, row). Returns what was received and what
    should have been."""
    out: dict[str, torch.Tensor] = {}
    send_splits = [rank + d + 1 for d in range(world)]
    recv_splits = [s + rank + 1 for s in range(world)]
    for shape in ((), (3,), (2, 2)):
        def rows(sender: int, receiver: int, n: int) -> torch.Tensor:
            base = torch.arange(n, dtype=torch.float32) + 16 * sender + 4 * receiver
            return base.reshape((n,) + (1,) * len(shape)).expand((n,) + shape)
        x = torch.cat([rows(rank, d, n) for d, n in enumerate(send_splits)]).to(torch.bfloat16)
        got = exchange_rows(x, send_splits, recv_splits, None)
        want = torch.cat([rows(s, rank, n) for s, n in enumerate(recv_splits)]).to(torch.bfloat16)
        out[f"got{len(shape) + 1}d"], out[f"want{len(shape) + 1}d"] = got, want
    try:
        exchange_rows(torch.tensor(1.0, dtype=torch.bfloat16), [0] * world, [0] * world, None)
        out["zero_d_error"] = torch.tensor(False)
    except ValueError:
        out["zero_d_error"] = torch.tensor(True)
    return out


def bf16_worker(rank: int, world: int, ranks_per_node: int, out_dir: str, sz: Sizes,
                cases: list[str]) -> None:
    """Every bfloat16 scenario; saves {out_dir}/rank{rank}.pt (errors as text, as suite_worker)."""
    ep = EPGroup.create(ranks_per_node)
    result: dict[str, Any] = {"equivalence": {}, "training": {}, "failures": {}}
    try:
        result["exchange_rows"] = run_bf16_exchange_rows(rank, world)
        for case in cases:
            result["equivalence"][case] = run_bf16_equivalence(ep, case, sz)
        for mode, fault in (("static", 0), ("scheduled", 2)):
            result["training"][mode] = run_training(ep, mode, sz, fault, torch.bfloat16)
    except Exception:  # noqa: BLE001 - reported to the test process
        result["failures"]["bf16"] = traceback.format_exc()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))

