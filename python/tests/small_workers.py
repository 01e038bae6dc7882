"""Worker code of the small multi-process tests (test_launch.py, test_runtime_tools.py): runs
inside spawned gloo processes."""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

import cobalt
from cobalt.torch import EPGroup, ExpertParallelMoE, ExpertParallelRuntime, PolicyLayoutSource


def one_rank_fails(rank: int, world: int, failing_rank: int) -> None:
    """`failing_rank` raises; the others wait in a collective and fail once it is gone."""
    dist.barrier()
    if rank == failing_rank:
        raise ValueError(f"the root cause, on rank {rank}")
    dist.all_reduce(torch.ones(1))


def records_kept(rank: int, world: int, out_dir: str) -> None:
    """len(runtime.records) after 5 forwards of one layer, for several keep_records values."""
    ep = EPGroup.create(ranks_per_node=1)
    kept = {}
    for keep in (True, 3, 0, False, None):
        source = PolicyLayoutSource("static", ep.topology, 4, 2, num_layers=1,
                                    slots_per_rank=cobalt.slots_for_rho(4, world, 0.5))
        rt = ExpertParallelRuntime(ep, source, keep_records=keep)
        moe = ExpertParallelMoE(rt, 0, 4, 6, 4, 2)
        for step in range(5):
            with torch.no_grad():
                moe(torch.randn(3, 4))
            rt.end_step()
        kept[repr(keep)] = [r.step for r in rt.records]
    torch.save(kept, os.path.join(out_dir, f"rank{rank}.pt"))


def cobalt_plus_layer(world: int, ranks_per_node: int, seed: int = 0
                      ) -> tuple[ExpertParallelRuntime, ExpertParallelMoE]:
    """One layer (H = 4, F = 6, E = 8, top-2) under cobalt+ planning every step (policy seed
    `seed`)."""
    ep = EPGroup.create(ranks_per_node=ranks_per_node)
    source = PolicyLayoutSource("cobalt+", ep.topology, 8, 2, num_layers=1,
                                slots_per_rank=cobalt.slots_for_rho(8, world, 0.5),
                                steps_per_global_plan=1, seed=seed)
    rt = ExpertParallelRuntime(ep, source)
    return rt, ExpertParallelMoE(rt, 0, 4, 6, 8, 2)


def train_steps(moe: ExpertParallelMoE, opt: torch.optim.Optimizer, steps: int, seed: int
                ) -> torch.Generator:
    """`steps` training steps of `moe` alone on random 16-token batches; returns the generator
    (to draw more inputs from)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        moe(torch.randn(16, moe.hidden_size, generator=g)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        moe.runtime.end_step()
    return g


def frozen_layouts(rank: int, world: int, out_dir: str) -> None:
    """Training steps under cobalt+ (a global plan every step), then evaluation forwards under
    runtime.frozen_layouts(): what the layout source and the expert bank saw."""
    rt, moe = cobalt_plus_layer(world, 2, seed=77)
    calls = []
    decide = rt.source.decide
    rt.source.decide = lambda step, layer, batch: (calls.append(step),
                                                   decide(step, layer, batch))[1]
    opt = torch.optim.SGD(moe.parameters(), lr=0.1)
    rt.attach_optimizer(None)
    g = train_steps(moe, opt, 3, seed=rank)
    trained = {"calls": len(calls), "version": moe.experts.version,
               "slots": moe.last_layout.slots.copy()}
    moe.eval()
    inputs = [torch.randn(16, 4, generator=g) for _ in range(4)]
    assign = cobalt.assign_balanced_cover
    keys = []  # the draw keys of the frozen forwards' assignments
    cobalt.assign_balanced_cover = lambda *args, **kwargs: (keys.append(
        {k: kwargs.get(k) for k in ("seed", "step", "layer", "token_offset")}),
        assign(*args, **kwargs))[1]
    try:
        with rt.frozen_layouts(), torch.no_grad():
            outputs = [moe(x) for x in inputs]
    finally:
        cobalt.assign_balanced_cover = assign
    frozen = {"calls": len(calls), "version": moe.experts.version,
              "slots": moe.last_layout.slots.copy(), "keys": keys}
    with torch.no_grad():  # the same inputs as ordinary steps: the same outputs
        after = {"max_diff": max((moe(x) - y).abs().max().item() for x, y in zip(inputs, outputs)),
                 "calls": len(calls)}
    torch.save({"trained": trained, "frozen": frozen, "after": after},
               os.path.join(out_dir, f"rank{rank}.pt"))


def reshard(rank: int, world: int, ranks_per_node: int, out_dir: str) -> None:
    """Trains 3 steps under cobalt+ and saves every expert's weights (rank 0), or, when the
    file exists, loads them into a fresh layer on this world size: what the layer then holds
    and computes."""
    path = os.path.join(out_dir, "experts.pt")
    rt, moe = cobalt_plus_layer(world, ranks_per_node)
    if not os.path.exists(path):
        opt = torch.optim.Adam(moe.parameters(), lr=0.05)
        rt.attach_optimizer(opt)
        train_steps(moe, opt, 3, seed=rank)
        weights = moe.gather_expert_weights()
        if rank == 0:
            torch.save({"weights": weights, "router": moe.router.state_dict(),
                        "version": moe.experts.version}, path)
        return
    saved = torch.load(path)
    rt.attach_optimizer(None)
    moe.router.load_state_dict(saved["router"])
    moe.load_expert_weights(*saved["weights"])
    x = torch.randn(5 + rank, 4, generator=torch.Generator().manual_seed(10 + rank))
    with torch.no_grad():
        y = moe(x)
    y.requires_grad_(False)
    out = moe(x)
    errors = []
    try:
        moe.load_expert_weights(*saved["weights"])  # its backward is still to run
    except ValueError as exc:
        errors.append(str(exc))
    out.sum().backward()
    try:
        moe.load_expert_weights(saved["weights"][0], saved["weights"][1], saved["weights"][0])
    except ValueError as exc:
        errors.append(str(exc))
    torch.save({"gathered": moe.gather_expert_weights(), "x": x, "y": y, "errors": errors},
               os.path.join(out_dir, f"loaded{rank}.pt"))


class _Alternating:
    """A layout source that alternates between two layouts, one per call."""

    name = "alternating"

    def __init__(self, layouts: list[cobalt.ExpertLayout]) -> None:
        self.layouts, self.calls = layouts, 0
        self.slots_per_rank = layouts[0].slots_per_rank

    def decide(self, step: int, layer: int, batch: cobalt.RoutingBatch):  # noqa: ANN201
        layout = self.layouts[self.calls % 2]
        self.calls += 1
        return layout, cobalt.assign_node_cover(batch, layout, step=step, layer=layer)


def frozen_after_a_deferred_change(rank: int, world: int, out_dir: str) -> None:
    """Two forwards into one backward with a layout change between them (deferred), then a frozen
    forward: the version in force before and after it."""
    ep = EPGroup.create(ranks_per_node=2)
    topo = ep.topology
    moved = [[(2 * r + 2) % 8, (2 * r + 3) % 8] for r in range(world)]
    source = _Alternating([cobalt.ExpertLayout.static_ep(topo, 8, 3),
                           cobalt.ExpertLayout.from_rank_lists(topo, 8, 3, moved)])
    rt = ExpertParallelRuntime(ep, source)
    rt.attach_optimizer(None)
    moe = ExpertParallelMoE(rt, 0, 4, 6, 8, 2)
    g = torch.Generator().manual_seed(rank)
    (moe(torch.randn(6, 4, generator=g)).sum() + moe(torch.randn(6, 4, generator=g)).sum()
     ).backward()
    before = {"version": moe.experts.version, "deferred": moe.experts.counters.deferred}
    with rt.frozen_layouts(), torch.no_grad():
        moe(torch.randn(6, 4, generator=g))
    torch.save({"before": before, "after": moe.experts.version, "calls": source.calls},
               os.path.join(out_dir, f"rank{rank}.pt"))


def one_rank_is_killed(rank: int, world: int, killed_rank: int) -> None:
    """`killed_rank` dies by SIGKILL (no Python exception); the others then fail in a
    collective."""
    import signal

    dist.barrier()
    if rank == killed_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


RESHARD_STEPS = (3, 2)  # optimizer steps before and after the move


def reshard_batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4 + rank, 4, generator=torch.Generator().manual_seed(1000 * step + rank))


class RowAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per row (dim 0) of each parameter: its state, [rows, 1, ...],
    is per bank slot but not shaped like the bank (as Adafactor's row statistics)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "row_sq" not in state:
                    state["row_sq"] = torch.zeros((p.shape[0],) + (1,) * (p.dim() - 1))
                state["row_sq"] += g.pow(2).sum(dim=tuple(range(1, p.dim())), keepdim=True)
                p -= group["lr"] * g / (state["row_sq"].sqrt() + 1e-8)


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.05) if kind == "adam" else RowAdagrad(params, lr=0.1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of `t`, flat, as integers (any dtype)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        flat.element_size()])


def _assert_same_state(got: Any, want: Any) -> None:
    """Equal nested dicts / lists of tensors and plain values (bitwise for tensors)."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want), (list(got), list(want))
        for key in want:
            _assert_same_state(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _assert_same_state(a, b)
    elif torch.is_tensor(want):  # bit patterns: torch.equal takes -0.0 for +0.0
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(_bits(got), _bits(want))
    else:
        assert got == want, (got, want)


def reshard_training(rank: int, world: int, ranks_per_node: int, out_dir: str,
                     kind: str, src: Optional[int]) -> None:
    """One layer trained by optimizer `kind`: RESHARD_STEPS[0] steps on this world size and
    gather_training_state to rank 1 (saved there), or, when the file exists,
    load_training_state (from rank `src` only, or on every rank when None) and
    RESHARD_STEPS[1] more steps; then every expert's weights and the router's."""
    from cobalt.torch import gather_training_state, load_training_state

    path = os.path.join(out_dir, "state.pt")
    rt, moe = cobalt_plus_layer(world, ranks_per_node)
    opt = make_optimizer(kind, moe.parameters())
    rt.attach_optimizer(opt)
    first = not os.path.exists(path)
    out: dict[str, Any] = {}
    if not first:
        saved = torch.load(path) if src in (None, rank) else None
        # Refused before anything is loaded, on every rank: a store part of another shape.
        bad = None if saved is None else {
            **saved, "experts": {"experts": {**saved["experts"]["experts"],
                                             "w2": saved["experts"]["experts"]["w1"]}}}
        router_before = moe.router.weight.detach().clone()
        try:
            load_training_state(moe, bad, opt, src=src)
        except ValueError as exc:
            out["refused"] = str(exc)
        out["router_unchanged"] = torch.equal(moe.router.weight, router_before)
        load_training_state(moe, saved, opt, src=src)
        out["step"] = rt.step
        if src is not None:
            try:  # the ranks disagreeing on src: refused on every rank
                load_training_state(moe, saved, opt, src=rank)
            except ValueError as exc:
                out["src_refused"] = str(exc)
            # A state missing a part, on rank src only: a ValueError on every rank (rank src
            # raised KeyError and the others waited).
            broken = None if saved is None else {k: v for k, v in saved.items()
                                                 if k != "optimizer"}
            try:
                load_training_state(moe, broken, opt, src=np.int64(src))
            except ValueError as exc:
                out["malformed"] = str(exc)
            saved = torch.load(path)
        # An optimizer holding only the router: the banks' state is not put into it.
        router_only = make_optimizer(kind, [moe.router.weight])
        load_training_state(moe, saved, router_only)
        out["router_only_states"] = len(router_only.state_dict()["state"])
    steps = range(RESHARD_STEPS[0]) if first else range(RESHARD_STEPS[0], sum(RESHARD_STEPS))
    for step in steps:
        moe(reshard_batch(rank, step)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        rt.end_step()
    if first:
        everywhere = gather_training_state(moe, opt)
        # To one rank: the same dict there, None elsewhere; the ranks disagreeing on dst, or
        # one out of range, fail every rank before anything is sent.
        state = gather_training_state(moe, opt, dst=1)
        assert (state is None) == (rank != 1)
        # Unequal on the ranks, out of range, a float (it reached send() on one rank and left the
        # others waiting), a bool (taken as rank 1): refused on every rank before any transfer.
        for bad_dst in (rank % 2, world, 1.0, True):
            try:
                gather_training_state(moe, opt, dst=bad_dst)
                raise AssertionError(f"dst={bad_dst!r} was taken")
            except ValueError as exc:
                assert f"dst must be the same rank in [0, {world})" in str(exc), exc
        _assert_same_state(gather_training_state(moe, opt, dst=np.int64(1)), state)
        if rank == 1:
            _assert_same_state(state, everywhere)
            torch.save({**state, "version": moe.experts.version}, path)
        return
    out.update(weights=moe.gather_expert_weights(), router=moe.router.weight.detach())
    torch.save(out, os.path.join(out_dir, f"final{rank}.pt"))


def copies_refused(rank: int, world: int, out_dir: str) -> None:
    """Each way of copying a model with an expert-parallel layer, or its runtime: the message
    (or "copied"); then a training step, which must still work."""
    import copy
    import io
    import pickle

    rt, moe = cobalt_plus_layer(world, 1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), moe)
    attempts = {
        "deepcopy": lambda: copy.deepcopy(model),
        "copy": lambda: copy.copy(moe),
        "pickle": lambda: pickle.dumps(moe),
        "torch.save": lambda: torch.save(model, io.BytesIO()),
        "runtime": lambda: copy.deepcopy(rt),
        "store": lambda: copy.deepcopy(moe.experts),
        "averaged": lambda: torch.optim.swa_utils.AveragedModel(model),
    }
    out: dict[str, str] = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = "copied"
        except TypeError as exc:
            out[name] = str(exc)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    rt.attach_optimizer(opt)
    train_steps(moe, opt, 2, seed=rank)
    out["step"] = str(rt.step)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def bits_kept(rank: int, world: int, out_dir: str) -> None:
    """A -0.0 in every rank's first main row: gather_expert_weights and gather_training_state,
    everywhere and to rank 0, keep it (a floating sum with zeros made it +0.0), in float32 and
    bfloat16."""
    from cobalt.torch import gather_training_state

    rt, moe = cobalt_plus_layer(world, 1)
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        moe.to(dtype)
        slot = int(moe.experts.main_slot[moe.experts.local_experts()[0]])
        with torch.no_grad():
            moe.experts.w1[slot, 0, 0] = -0.0
        mains = [int(np.flatnonzero(moe.experts.main_rank == r)[0]) for r in range(world)]
        w1 = moe.gather_expert_weights()[0]
        everywhere = gather_training_state(moe)
        to_zero = gather_training_state(moe, dst=0)
        out[str(dtype)] = {
            "weights": [bool(torch.signbit(w1[e, 0, 0])) for e in mains],
            "state": [bool(torch.signbit(everywhere["experts"]["experts"]["w1"][e, 0, 0]))
                      for e in mains]}
        if rank == 0:
            _assert_same_state(to_zero, everywhere)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
