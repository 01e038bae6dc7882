"""ExpertParallelMoE: a MoE layer (router, top-k, SwiGLU experts) whose experts are distributed
over an expert-parallel process group and executed where the C++ core's layout and assignment say.

Forward, on every rank (collectives in the same order everywhere):

1. Router on the local tokens x [T_r, H] -> topk ids and gate weights [T_r, K].
2. Check every rank's router output (errors raise on all ranks), all-gather the ids.
3. The layout source decides (layout, exec_rank [T, K]) from the global routing; optionally
   verified identical on every rank.
4. If the layout differs from the version in force: apply it (main instances migrate with their
   gradient and optimizer state rows, checksummed, all-or-nothing;
   :mod:`cobalt.torch.expert_store`). While an earlier forward of this step still waits for its
   backward pass, the mains stay where they are and the change waits for a later forward.
5. Replica copies fetched from main instances.
6. Dispatch with node-level dedup, experts, combine with in-node reduction
   (:mod:`cobalt.torch.exchange_plan`), each exchange differentiable.

Backward runs the exchanges in reverse; at the end of the backward pass a queued callback sends
replica gradients to their main instances and (optionally) all-reduces the router gradient. A
backward pass that reaches the router without passing through the layer's output (an auxiliary
router loss backpropagated on its own) also all-reduces the router gradient at its end, so the
optimizer always sees the group's summed router gradient: every rank must run the same backward
passes, as with DDP. Frozen expert weights (``requires_grad=False``, the whole bank or single
tensors) get no ``.grad``, so optimizers leave them unchanged.

Devices. The runtime runs CPU tensors over gloo: an input, router output or expert bank on
another device raises a ValueError on every rank before any exchange (the per-step operations of
:mod:`cobalt.torch.ops` do run on CUDA tensors). A forward under ``torch.inference_mode()`` runs
as under ``torch.no_grad()`` (gloo writes its results outside inference mode, which inference
tensors refuse); its output is a normal tensor.

Collective order. gloo (like NCCL) needs every rank to issue the same collectives in the same
order. Forward order is program order. In backward, a layer's four exchanges form a chain of data
dependencies, and layers stacked in sequence are ordered by the residual stream; whether an
exchange takes part in backward is decided globally (the requires-grad state is agreed during the
routing gather), and a rank whose experts receive no tasks still keeps every exchange in its
graph. MoE layers applied in parallel to the same input rely on autograd running identical
graphs in the same order on every rank (it does: it prefers the most recently created node).
Every rank must backpropagate through every MoE output it computed.

Activation checkpointing (``torch.utils.checkpoint``, reentrant or not). A forward that runs
while the autograd engine runs a backward pass is a recomputation: it replays the decision of
the forward it recomputes, found by the global routing among the decisions of the current step
(at most ``recompute_cache_size`` per layer, 64 by default, and ``recompute_cache_bytes``, 256 MiB;
cleared at ``runtime.end_step()``), so the layout source is asked once
per forward, the source's statistics and the step records count it once, and the recomputed
exchanges have the shapes of the original ones (non-reentrant checkpointing needs that). Nothing
migrates during a backward pass. Replicas are fetched again from the main instances, whose values
the optimizer has not changed yet; the traffic counters count the recomputation's exchanges,
which do happen. A recomputation whose routing matches no kept decision (a router that is not
deterministic under recomputation, or more forwards in the step than the cache holds), or two
different decisions (the same global batch through the layer twice in a step with a source that
decided differently, e.g. an extra no_grad forward of the same batch for logging with the
``cobalt`` or ``cobalt+`` policy, which numbers a step's tokens on over its calls, so that the
second forward draws other ties, or with a per-call peer whose plan depends on the call; the
fixed and scheduled sources key their draws by the routing and decide the same),
raises a RuntimeError on every rank alike - the lookup uses only the
global routing, which every rank shares.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import collections
import hashlib
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

import cobalt
from cobalt.torch._no_copy import NotCopyable
from cobalt.torch._autograd import in_backward_pass
from cobalt.torch.all_to_all import all_to_all_rows
from cobalt.torch.ddp import check_ddp
from cobalt.torch.dense_grads import DenseGradSync, allreduce_gradients
from cobalt.torch.exchange_plan import ExchangePlan, RoutingGlobal, build_exchange_plan
from cobalt.torch.expert_store import ExpertStore, ReplicaFetch
from cobalt.torch.layout_source import routing_token_offset
from cobalt.torch.experts import TopKRouter, swiglu
from cobalt.torch.routing_gather import (GatheredRouting, agree_on_errors, check_input,
                                         gather_routing)
from cobalt.torch.runtime import ExpertParallelRuntime, StepRecord

__all__ = ["ExpertParallelMoE", "allreduce_gradients"]

Router = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class _BackwardWindow:
    """Keeps a forward's backward window (ExpertStore.open_backward) open while its autograd
    graph can still be backpropagated: closed by the end-of-pass callback once the graph's saved
    tensors are freed (a backward without retain_graph), or when the graph itself is dropped
    (a forward never backpropagated)."""

    def __init__(self, store: ExpertStore, token: int) -> None:
        self.store, self.token = store, token

    def close(self) -> None:
        self.store.close_backward(self.token)

    def __del__(self) -> None:
        self.close()


class _AfterBackward(torch.autograd.Function):
    """Identity whose backward calls `on_queue` and queues `callback` to run when the whole
    backward pass is done; then closes `window` unless the graph was retained for another
    backward pass."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, callback: Callable[[], None],
                on_queue: Callable[[], None], window: _BackwardWindow) -> torch.Tensor:
        ctx.callback, ctx.on_queue, ctx.window = callback, on_queue, window
        ctx.save_for_backward(y.new_zeros(()))  # freed after a backward without retain_graph
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        def at_end() -> None:
            ctx.callback()
            try:
                ctx.saved_tensors
            except RuntimeError:  # the graph is freed: no further backward through it
                ctx.window.close()
        ctx.on_queue()
        Variable._execution_engine.queue_callback(at_end)
        return grad, None, None, None


class _Tie(torch.autograd.Function):
    """Returns `out` unchanged while making it depend on `anchor` (with a zero gradient), so the
    exchanges that produced `anchor` stay in the backward graph even when this rank's experts do
    not use it (collectives must run on every rank)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        ctx.anchor_shape = anchor.shape
        return out.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.new_zeros(ctx.anchor_shape)


def _nothing() -> None:
    pass


def _as_grad_input(t: torch.Tensor, needed: bool) -> torch.Tensor:
    """`t`, or a detached leaf copy that requires grad when every rank's exchange needs a
    backward but this rank's input does not have one."""
    if needed and not t.requires_grad:
        return t.detach().requires_grad_(True)
    return t


def _routing_key(gathered: GatheredRouting) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in (gathered.topk_ids, gathered.source_rank):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def _decision_digest(layout: cobalt.ExpertLayout, exec_rank: np.ndarray) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(layout.slots).tobytes())
    h.update(np.ascontiguousarray(exec_rank).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


class ExpertParallelMoE(NotCopyable, nn.Module):
    """MoE layer with experts distributed over ``runtime.ep`` (G ranks, N nodes).

    Args:
        runtime: shared :class:`ExpertParallelRuntime` (process group, layout source, step).
        layer: index of this MoE layer in the model (the policy's layer).
        hidden_size, ffn_size: H and F of the SwiGLU experts (w1, w3 [H, F], w2 [F, H]).
        num_experts, top_k: E and K.
        router: module/callable x [T, H] -> (topk_ids [T, K] int, weights [T, K]); default a
            :class:`TopKRouter` initialised from (seed, layer), identical on every rank. Only an
            ``nn.Module`` router's parameters are the layer's (summed by ``sync_dense_grads``,
            listed by :meth:`dense_parameters`); a plain callable's are not, and building the
            layer with one warns (sum their gradients yourself).
        seed: initial weights are ``expert_init(seed, layer, e, ...)``, the same as
            :class:`~cobalt.torch.ReferenceMoE` with that seed.
        sync_dense_grads: sum the router's gradients over the group at the end of each
            backward pass that reaches them, through the layer's output or not (each pass's
            gradient once, so gradient accumulation, retained graphs and auxiliary router losses
            backpropagated on their own sum correctly). A collective at the end of such passes:
            every rank must run the same backward passes. Turn off to reduce them yourself, e.g.
            once after several passes with :func:`allreduce_gradients` on
            :meth:`dense_parameters`.

    forward(x [T_r, H]) -> [T_r, H] (this rank's tokens on the CPU; T_r may differ between
    ranks). Every rank must call forward (and backward through its output) the same number of
    times. Gradients are those of the sum of all ranks' losses.

    Checkpoints: ``load_state_dict`` checks the experts' saved placement before anything of the
    layer is loaded, so a refused checkpoint (ValueError) changes nothing in this layer; use
    :func:`~cobalt.torch.check_checkpoint` to refuse one before any module of a model changes.
    """

    def __init__(self, runtime: ExpertParallelRuntime, layer: int, hidden_size: int,
                 ffn_size: int, num_experts: int, top_k: int, *,
                 router: Optional[Router] = None, seed: int = 0,
                 sync_dense_grads: bool = True) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"ExpertParallelMoE: top_k {top_k} out of range [1, {num_experts}]")
        self.runtime = runtime
        self.layer = layer
        self.hidden_size = hidden_size
        self.ffn_size = ffn_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.sync_dense_grads = sync_dense_grads
        if router is not None and not isinstance(router, nn.Module) and sync_dense_grads:
            warnings.warn(
                "ExpertParallelMoE: the router is a plain callable, not an nn.Module: parameters "
                "it uses are not this layer's, so sync_dense_grads does not sum their gradients "
                "over the ranks (pass the router as an nn.Module, or sum them yourself and pass "
                "sync_dense_grads=False)", stacklevel=2)
        self.router: Router = router if router is not None else TopKRouter(
            hidden_size, num_experts, top_k, seed=seed, layer=layer)
        self.experts = ExpertStore(runtime.ep, num_experts, hidden_size, ffn_size,
                                   runtime.slots_per_rank, seed=seed, layer=layer,
                                   traffic=runtime.traffic)
        self.last_plan: Optional[ExchangePlan] = None
        self.last_exec_rank: Optional[np.ndarray] = None
        self.last_topk_ids: Optional[np.ndarray] = None
        self.last_layout: Optional[cobalt.ExpertLayout] = None
        self._dense_sync = DenseGradSync(runtime.ep.group)
        # This step's decisions, for activation-checkpoint recomputation:
        # routing key -> [(layout, exec_rank [T, K]), ...] (one per forward), oldest key first.
        self._decisions: collections.OrderedDict[
            bytes, list[tuple[cobalt.ExpertLayout, np.ndarray]]] = collections.OrderedDict()
        self._decisions_step = -1
        # Bounds of the kept decisions per layer (exec_rank is the global [T, K] assignment,
        # kept as int16 when G < 32768): count and bytes; cleared at runtime.end_step().
        self.recompute_cache_size = 64
        self.recompute_cache_bytes = 256 << 20
        self.num_recomputed = 0  # forwards that replayed a decision (identical on every rank)
        runtime.on_end_step(self._clear_decisions)
        if sync_dense_grads:  # also router-only passes before the first forward are summed
            self._dense_sync.track(self.dense_parameters())

    # ------------------------------------------------------------------ parameters
    def expert_parameters(self) -> list[nn.Parameter]:
        """The expert bank (main instances on this rank): not data-parallel."""
        return list(self.experts.bank)

    def dense_parameters(self) -> list[nn.Parameter]:
        """Replicated (data-parallel) trainable parameters: the router's."""
        bank = {id(p) for p in self.experts.bank}
        return [p for p in self.parameters() if id(p) not in bank and p.requires_grad]

    def gather_expert_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """w1, w3 [E, H, F], w2 [E, F, H] of every expert's main instance (a collective)."""
        return self.experts.gather_main_weights()

    def load_expert_weights(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> None:
        """Loads every expert's weights, w1, w3 [E, H, F], w2 [E, F, H] (the same tensors on
        every rank; e.g. a pretrained MoE's, or :meth:`gather_expert_weights` saved by a run of
        another world size or bank capacity): each rank keeps its main instances' rows. The
        optimizer's state is left as it is (build or reset it after loading). Refused while a
        forward of this rank waits for its backward pass (load between steps)."""
        if self.experts.backward_pending(self.runtime.step):
            raise ValueError(f"{self._context()}: load_expert_weights while a forward waits for "
                             "its backward pass (load between steps)")
        self.experts.load_main_weights(w1, w3, w2)

    # ------------------------------------------------------------------ checkpoints
    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        # torch loads a module before its children: the experts' placement is checked here,
        # before the router or the bank is touched, so a checkpoint whose placement is refused
        # changes nothing in this layer. Modules loaded before the layer may be loaded already
        # (cobalt.torch.check_checkpoint checks a whole model first). Refused, as
        # load_expert_weights is, while a forward waits for its backward pass: that pass holds
        # views of the bank rows and returns replica gradients to the placement in force.
        if self.experts.backward_pending(self.runtime.step):
            raise ValueError(f"{self._context()}: load_state_dict while a forward waits for its "
                             "backward pass (load between steps)")
        self.experts.check_placement_saved(state_dict, prefix + "experts.")
        super()._load_from_state_dict(state_dict, prefix, *args)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ forward
    def _any_backward_pending(self) -> bool:
        """Whether a forward of this step on any rank still waits for its backward (agreed:
        a window is closed when its graph is freed, which a reference cycle can delay on one
        rank; the ranks must take the same branch, since one branch runs collectives)."""
        flag = torch.tensor([int(self.experts.backward_pending(self.runtime.step))],
                            dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.runtime.ep.group)
        return bool(flag.item())

    def _context(self) -> str:
        return f"ExpertParallelMoE layer {self.layer}, step {self.runtime.step}"

    def _decide(self, gathered: GatheredRouting) -> tuple[cobalt.ExpertLayout, np.ndarray,
                                                          cobalt.RoutingBatch]:
        """The layout source's decision for this forward, checked on every rank. A source that
        raises or returns an invalid decision on some ranks raises ValueError on every rank (the
        problem is agreed on before any exchange, so no rank waits in one alone); ranks deciding
        differently raise RuntimeError on every rank (with verify_decisions)."""
        ep = self.runtime.ep
        batch = cobalt.RoutingBatch(gathered.topk_ids, gathered.source_rank, self.num_experts,
                                    ep.world_size)
        error: Optional[str] = None
        digest = 0
        try:
            layout, exec_rank = self._checked_decision(batch)
            if self.runtime.verify_decisions:
                digest = _decision_digest(layout, exec_rank)
        except Exception as exc:  # noqa: BLE001 - agreed on below, raised on every rank
            error = str(exc) if isinstance(exc, ValueError) else \
                f"layout source '{self.runtime.source.name}' raised {type(exc).__name__}: {exc}"
        mine = torch.tensor([digest, 0 if error is None else 1], dtype=torch.int64)
        hi = mine.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=ep.group)
        if hi[1].item():
            agree_on_errors(ep, error, self._context())
        if self.runtime.verify_decisions:
            lo = mine.clone()
            dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=ep.group)
            if lo[0].item() != hi[0].item():
                raise RuntimeError(f"{self._context()}: ranks decided different layouts or "
                                   f"assignments (layout source '{self.runtime.source.name}' "
                                   "is not deterministic across ranks)")
        return layout, exec_rank, batch

    def _checked_decision(self, batch: cobalt.RoutingBatch
                          ) -> tuple[cobalt.ExpertLayout, np.ndarray]:
        """(layout, exec_rank [T, K] int32) from the layout source; raises ValueError naming what
        does not fit this layer."""
        ep = self.runtime.ep
        name = self.runtime.source.name
        in_force = self.experts.layout_slots
        if self.runtime.layouts_frozen and in_force is not None:
            # The layout in force (a change deferred or rolled back leaves the last decided
            # one different): nothing moves.
            layout = self.last_layout
            if layout is None or not np.array_equal(np.asarray(layout.slots), in_force):
                layout = cobalt.ExpertLayout(ep.topology, self.num_experts, in_force)
            # The source's seed, and draws keyed by the routing (routing_token_offset): each
            # evaluation batch draws its own ties, and the same batch the same ones.
            seed = getattr(self.runtime.source, "seed", 0)
            if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
                seed = 0  # a source without a usable seed
            return layout, cobalt.assign_balanced_cover(
                batch, layout, seed=int(seed), step=self.runtime.step, layer=self.layer,
                token_offset=routing_token_offset(batch))
        layout, exec_rank = self.runtime.source.decide(self.runtime.step, self.layer, batch)
        if not isinstance(layout, cobalt.ExpertLayout):
            raise ValueError(f"layout source '{name}' returned a {type(layout).__name__}, "
                             "expected a cobalt.ExpertLayout")
        if layout.num_ranks != ep.world_size or layout.num_experts != self.num_experts:
            raise ValueError(f"layout source returned a layout for "
                             f"G={layout.num_ranks}, E={layout.num_experts}")
        if layout.slots_per_rank > self.experts.capacity:
            raise ValueError(f"layout has {layout.slots_per_rank} slots per "
                             f"rank, the expert bank {self.experts.capacity}")
        if layout.topology.ranks_per_node != ep.ranks_per_node:
            raise ValueError(f"layout topology {layout.topology} does not "
                             f"match the group's {ep.num_nodes}x{ep.ranks_per_node}")
        exec_rank = np.asarray(exec_rank)
        if exec_rank.dtype.kind not in "iu":  # a float or bool rank would be truncated
            raise ValueError(f"layout source '{name}' returned exec_rank of dtype "
                             f"{exec_rank.dtype}, expected integers")
        outside = np.flatnonzero((exec_rank < 0) | (exec_rank >= ep.world_size))
        if outside.size:
            task = int(outside[0])
            raise ValueError(f"layout source '{name}' returned exec_rank "
                             f"{int(exec_rank.reshape(-1)[task])} for task {task}, out of range "
                             f"[0, {ep.world_size})")
        exec_rank = np.ascontiguousarray(exec_rank, dtype=np.int32)
        if exec_rank.shape != (batch.num_tokens, self.top_k):
            raise ValueError(f"layout source '{name}' "
                             f"returned exec_rank of shape {list(exec_rank.shape)}, expected "
                             f"[tokens, top_k] = [{batch.num_tokens}, {self.top_k}]")
        cobalt.validate_assignment(batch, layout, exec_rank)
        return layout, exec_rank

    def _replay(self, gathered: GatheredRouting) -> tuple[cobalt.ExpertLayout, np.ndarray,
                                                          cobalt.RoutingBatch]:
        """The decision of the forward being recomputed (the layout source is not asked). Raises
        RuntimeError, on every rank alike, when none or two different ones match."""
        ep = self.runtime.ep
        batch = cobalt.RoutingBatch(gathered.topk_ids, gathered.source_rank, self.num_experts,
                                    ep.world_size)
        kept = (self._decisions.get(_routing_key(gathered))
                if self._decisions_step == self.runtime.step else None)
        if not kept:
            raise RuntimeError(
                f"{self._context()}: a recomputed forward (activation checkpointing) whose "
                "routing matches no forward of this step: the router must be deterministic "
                "under recomputation (keep preserve_rng_state), and at most "
                f"recompute_cache_size = {self.recompute_cache_size} forwards per step "
                f"(recompute_cache_bytes = {self.recompute_cache_bytes}) are kept")
        layout, exec_rank = kept[0]
        exec_rank_i32 = np.ascontiguousarray(exec_rank, dtype=np.int32)
        for other_layout, other_exec in kept[1:]:
            if (not np.array_equal(other_layout.slots, layout.slots)
                    or not np.array_equal(other_exec, exec_rank)):
                raise RuntimeError(
                    f"{self._context()}: a recomputed forward (activation checkpointing) matches "
                    "two forwards of this step with the same routing but different decisions; "
                    "cannot tell which one it recomputes")
        self.num_recomputed += 1
        return layout, exec_rank_i32, batch

    def _clear_decisions(self) -> None:
        self._decisions.clear()

    def _keep_decision(self, gathered: GatheredRouting, layout: cobalt.ExpertLayout,
                       exec_rank: np.ndarray) -> None:
        if self._decisions_step != self.runtime.step:  # recomputations happen within the step
            self._decisions.clear()
            self._decisions_step = self.runtime.step
        if self.recompute_cache_size <= 0 or self.recompute_cache_bytes <= 0:
            return
        compact = exec_rank.astype(np.int16) if self.runtime.ep.world_size < 32768 else exec_rank
        key = _routing_key(gathered)
        self._decisions.setdefault(key, []).append((layout, compact))

        def count_and_bytes() -> tuple[int, int]:
            entries = [e for v in self._decisions.values() for _, e in v]
            return len(entries), sum(e.nbytes for e in entries)

        count, nbytes = count_and_bytes()
        while self._decisions and (count > self.recompute_cache_size
                                   or nbytes > self.recompute_cache_bytes):
            oldest = next(iter(self._decisions))
            self._decisions[oldest].pop(0)
            if not self._decisions[oldest]:
                del self._decisions[oldest]
            count, nbytes = count_and_bytes()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_ddp(self)  # plain DistributedDataParallel(model) corrupts the experts: refused
        if torch.is_inference_mode_enabled():
            # gloo writes collective results outside inference mode, which inference tensors
            # refuse: run as under no_grad (the output is then a normal tensor).
            with torch.inference_mode(False), torch.no_grad():
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        rt = self.runtime
        ep = rt.ep
        recompute = in_backward_pass()
        if not recompute:  # no backward pass runs on this thread: none has a sync queued
            self._dense_sync.queued = False
        ids: Optional[torch.Tensor] = None
        gates: Optional[torch.Tensor] = None
        try:
            error = check_input(x, self.hidden_size, self.experts.w1.dtype,
                                bank_device=self.experts.w1.device)
        except Exception as exc:  # noqa: BLE001 - e.g. not a tensor; reported on every rank
            error = f"checking the input raised {type(exc).__name__}: {exc}"
        if error is None:
            try:
                ids, gates = self.router(x)
            except Exception as exc:  # noqa: BLE001 - reported on every rank below
                error = f"router raised {type(exc).__name__}: {exc}"
        gathered = gather_routing(ep, x, ids, gates, hidden=self.hidden_size,
                                  num_experts=self.num_experts, top_k=self.top_k,
                                  context=self._context(), local_error=error,
                                  traffic=rt.traffic,
                                  placement_digest=self.experts.placement_digest(),
                                  bank_trainable=any(p.requires_grad for p in self.experts.bank),
                                  dense_sync_numel=sum(p.numel() for p in self.dense_parameters())
                                  if self.sync_dense_grads else 0)
        if np.unique(gathered.placement_digests).shape[0] != 1:
            # Every rank sees the same digests, so every rank raises here.
            raise RuntimeError(
                f"{self._context()}: ranks hold different main placements of the experts "
                f"(digests by rank: {gathered.placement_digests.tolist()}); was each rank's "
                "checkpoint loaded on the rank that saved it?")
        assert gates is not None
        if recompute:
            layout, exec_rank, batch = self._replay(gathered)
        else:
            layout, exec_rank, batch = self._decide(gathered)
            self._keep_decision(gathered, layout, exec_rank)
        slots = np.asarray(layout.slots)

        changed = not recompute and (self.experts.layout_slots is None or not np.array_equal(
            self.experts.layout_slots, slots))
        migration_ok = True
        applied = False
        if changed:
            # An earlier forward of this step still waits for its backward (it holds views of
            # bank rows and the slots its replica gradients return to): run this layout with the
            # mains where they are and apply it at a later forward. The pending state is the
            # same on every rank (every rank runs the same forwards and backward passes).
            if self._any_backward_pending():
                self.experts.counters.deferred += 1
            else:
                migration_ok = self.experts.apply_layout(
                    slots, rt.optimizer, optimizer_attached=rt.optimizer_attached)
                applied = migration_ok

        grad_on = torch.is_grad_enabled()
        experts_grad = grad_on and any(p.requires_grad for p in self.experts.bank)
        dispatch_grad = grad_on and gathered.any_requires_grad
        combine_grad = dispatch_grad or experts_grad
        weights, fetch = self.experts.fetch_replicas(slots, requires_grad=experts_grad)
        plan = build_exchange_plan(
            RoutingGlobal(gathered.topk_ids, exec_rank, gathered.source_rank,
                          gathered.token_offsets, slots, ep.ranks_per_node), ep.rank)
        y = self._exchange_and_compute(x, gates, plan, weights, dispatch_grad, combine_grad)
        if combine_grad:
            sync_dense = self.sync_dense_grads
            self._dense_sync.track(self.dense_parameters() if sync_dense else [])
            window = _BackwardWindow(self.experts, self.experts.open_backward(rt.step))
            y = _AfterBackward.apply(
                y, self._make_after_backward(fetch, sync_dense),
                self._dense_sync.mark_queued if sync_dense else _nothing, window)

        if recompute:  # counted once, by the forward it recomputes
            return y
        self.last_plan, self.last_exec_rank = plan, exec_rank
        self.last_topk_ids, self.last_layout = gathered.topk_ids, layout
        if rt.keep_records:
            m = cobalt.step_metrics(batch, exec_rank, ep.topology)
            rt.add_record(StepRecord(
                step=rt.step, layer=self.layer, version=self.experts.version,
                layout_changed=applied, migration_ok=migration_ok,
                num_tokens=int(batch.num_tokens), num_tasks=int(batch.num_tasks),
                cross_node_tokens=int(m.transfers.dedup),
                cross_node_tasks_no_dedup=int(m.transfers.no_dedup),
                rank_loads=np.array(m.rank_loads), imbalance=float(m.imbalance),
                num_replicas=int(layout.num_replicas)))
        return y

    def _exchange_and_compute(self, x: torch.Tensor, gates: torch.Tensor, plan: ExchangePlan,
                              weights: list[Optional[tuple[torch.Tensor, ...]]],
                              dispatch_grad: bool, combine_grad: bool) -> torch.Tensor:
        """Dispatch, experts, combine. `dispatch_grad` / `combine_grad` (the same on every rank)
        say whether those exchanges take part in the backward pass; every rank then keeps them
        in its graph, whether or not its own tokens or experts need them."""
        ep, traffic = self.runtime.ep, self.runtime.traffic
        h, k = self.hidden_size, self.top_k

        def idx(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))

        # Dispatch: payload rows = [hidden state | K gate weights].
        payload = _as_grad_input(torch.cat([x, gates.to(x.dtype)], dim=1), dispatch_grad)
        parts = (("dispatch", h), ("dispatch_gates", k))
        recv1 = all_to_all_rows(payload.index_select(0, idx(plan.s1_send_idx)),
                                plan.s1_send_splits, plan.s1_recv_splits, ep.group, traffic, parts)
        recv2 = all_to_all_rows(recv1.index_select(0, idx(plan.s2_send_idx)),
                                plan.s2_send_splits, plan.s2_recv_splits, ep.group, traffic, parts)
        table = torch.cat([payload, recv1, recv2], dim=0).index_select(0, idx(plan.table_idx))

        # Experts: each local slot on its tasks, gated, summed per token-table row. The slots'
        # rows are gathered in one index_select and split (one backward node each, where
        # indexing the table per slot made each slot's backward write a table-sized zero tensor).
        active = [j for j, w in enumerate(weights)
                  if w is not None and plan.slot_rows[j].shape[0] > 0]
        partial = x.new_zeros((plan.num_table_rows, h))
        if active:
            rows_all = idx(np.concatenate([plan.slot_rows[j] for j in active]))
            parts = table.index_select(0, rows_all).split(
                [int(plan.slot_rows[j].shape[0]) for j in active])
            outs = []
            for j, part in zip(active, parts):
                g = part[:, h:].gather(1, idx(plan.slot_k[j])[:, None])  # [n, 1] gate weights
                outs.append(swiglu(part[:, :h], *weights[j]) * g)  # type: ignore[misc]
            partial = partial.index_add(0, rows_all, torch.cat(outs))
        if table.requires_grad:
            partial = _Tie.apply(partial, table)
        partial = _as_grad_input(partial, combine_grad)

        # Combine: same-node partials to the source / rail peer, one cross-node row per node.
        cparts = (("combine", h),)
        recv_a = all_to_all_rows(partial.index_select(0, idx(plan.ca_send_idx)),
                                 plan.ca_send_splits, plan.ca_recv_splits, ep.group, traffic,
                                 cparts)
        rail = x.new_zeros((int(sum(plan.cb_send_splits)), h))
        rail = rail.index_add(0, idx(plan.q_own_dst), partial.index_select(0, idx(plan.q_own_src)))
        rail = rail.index_add(0, idx(plan.q_recv_dst), recv_a.index_select(0, idx(plan.q_recv_src)))
        recv_b = all_to_all_rows(rail, plan.cb_send_splits, plan.cb_recv_splits, ep.group,
                                 traffic, cparts)
        y = x.new_zeros((plan.num_local_tokens, h))
        y = y.index_add(0, idx(plan.y_own_dst), partial.index_select(0, idx(plan.y_own_src)))
        y = y.index_add(0, idx(plan.y_recv_a_dst), recv_a.index_select(0, idx(plan.y_recv_a_src)))
        y = y.index_add(0, idx(plan.y_recv_b_dst), recv_b)
        return y

    def _make_after_backward(self, fetch: Optional[ReplicaFetch], sync_dense: bool
                             ) -> Callable[[], None]:
        def after_backward() -> None:
            if fetch is not None:
                self.experts.return_replica_grads(fetch)
            else:
                self.experts.ensure_grads()
            if sync_dense:
                self._dense_sync.sync()
        return after_backward
