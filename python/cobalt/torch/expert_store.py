"""Expert parameters of one MoE layer under expert parallelism.

* **Main instances.** Each expert's trainable parameters live on exactly one rank (its main rank),
  in a bank of `capacity` slots: w1, w3 [C, hidden, ffn] and w2 [C, ffn, hidden] are ordinary
  nn.Parameters, so any torch optimizer keeps its state for them where they live. Unused bank
  slots are zero (and, having zero gradients, stay zero under the usual optimizers).
* **Replicas.** Every step, each rank that the layout gives a replica of e without holding e's
  main receives a copy of e's main parameters (forward); after the backward pass the replica's
  gradient goes back to the main instance and is added to its gradient (TopoEP style: the
  optimizer state exists only at the main instance). Both go node-deduplicated, like the token
  dispatch: one inter-node copy per (expert, node), relayed within the node over NVLink
  (:class:`ReplicaFetch`), as the simulator's cost model charges them.
* **Layout changes.** When the layout in force changes, main instances whose rank no longer holds
  their expert move to a rank that does, together with their optimizer state
  (:meth:`ExpertStore.apply_layout`). A change is versioned and all-or-nothing: parameters and
  optimizer state of every expert are checksummed before; arriving rows are verified against
  those checksums before anything is written; after the commit every expert's checksum must be
  unchanged, otherwise the bank, the optimizer state and the placement are restored on every rank.
  A trainable bank moves only with its optimizer declared (``ExpertParallelRuntime.attach_optimizer``,
  None for an optimizer without per-parameter state): a main instance moved without its
  optimizer state would inherit whatever the arriving slot held. Every rank checks this, and that
  every rank moves the same parts, before any row travels (a clear error on every rank).
  Accumulated gradients (``.grad`` rows) move with their expert too, so a change between the
  micro-batches of gradient accumulation keeps every expert's gradient. Rows travel as raw bytes:
  any dtype migrates exactly.
* **Pending backward passes.** A forward whose backward pass has not run yet holds views of the
  bank rows and the slots its replica gradients return to, so main instances never move while one
  is pending (:meth:`open_backward` / :meth:`close_backward`); the layer then runs the new layout
  with the mains where they are (replicas are fetched from wherever the mains are) and applies
  the change at its next forward without a pending backward (``MigrationCounters.deferred``).
* **Checkpoints.** The main placement (rank and bank slot of every expert) and the version are part
  of the module's ``state_dict`` (``get_extra_state``), so a bank saved after layout changes loads
  back with every expert in its row. A placement written for another number of experts, world
  size or bank capacity, or by another rank (each rank's bank holds its own experts: every rank
  saves and loads its own file), is refused (ValueError) before this store's rows are copied, and
  so are bank rows without their placement and a placement without all its bank rows (or with
  rows of another shape), which torch would apply to rows it does not describe; an
  :class:`~cobalt.torch.ExpertParallelMoE` checks it before its router too. Modules that
  ``load_state_dict`` reaches earlier are loaded by then: :func:`check_checkpoint` checks every
  store of a model without loading anything, so a training script can refuse a checkpoint
  before any module changes.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from cobalt.torch._no_copy import NotCopyable
from cobalt.torch.all_to_all import exchange_rows
from cobalt.torch.reduce import all_reduce_disjoint_
from cobalt.torch.checksum import digest
from cobalt.torch.ep_group import EPGroup
from cobalt.torch.experts import expert_init
from cobalt.torch.main_placement import follow_layout, initial_main_placement
from cobalt.torch.routing_gather import agree_on_errors
from cobalt.torch.traffic import TrafficStats

__all__ = ["ExpertStore", "MigrationCounters", "ReplicaFetch", "check_checkpoint"]

# fault_hook(stage, tensor): called with the received migration rows ("migration.recv", uint8
# [rows, bytes]: every moving part of an expert as raw bytes) before
# they are verified, so tests can corrupt them and check the rollback.
FaultHook = Callable[[str, torch.Tensor], None]


@dataclass
class MigrationCounters:
    """What layout changes did to this layer's main instances (identical on every rank)."""

    versions_applied: int = 0  # successful layout changes (including ones that moved nothing)
    main_moves_cross_node: int = 0
    main_moves_intra_node: int = 0
    rollbacks: int = 0
    deferred: int = 0  # forwards that ran a new layout with the mains unmoved (backward pending)
    last_error: str = ""


@dataclass
class ReplicaFetch:
    """One forward's replica copies, kept until their gradients go back. Copies travel in two
    hops, like the token dispatch: from the main instance to each replica on the main's node and
    to one relay replica per other node holding the expert (phase 1: one inter-node copy per
    (expert, node)), then from the relay to the node's other replicas (phase 2, NVLink).
    Gradients return the same way reversed, summed at the relay."""

    leaf: torch.Tensor  # [n1 + n2, 3 * hidden * ffn] received copies, phase 1 rows first
    send_experts: np.ndarray  # experts whose main rows this rank sent in phase 1, in send order
    send_splits: list[int]  # phase 1
    recv_splits: list[int]  # phase 1 (n1 = sum)
    main_slot: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    relay_send_splits: list[int] = field(default_factory=list)  # phase 2
    relay_recv_splits: list[int] = field(default_factory=list)  # phase 2 (n2 = sum)
    # Phase-1 row (index into the leaf) of each row this rank relayed in phase 2, in send order.
    relay_rows: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))


def _route(src: np.ndarray, dst: np.ndarray, expert: np.ndarray, me: int, world: int
           ) -> tuple[np.ndarray, list[int], np.ndarray, list[int]]:
    """One all_to_all of expert rows given every message (src, dst, expert) of the group: the
    experts this rank sends, ordered by (dst, expert), with per-destination counts, and the
    experts it receives, ordered by (src, expert) - the order the rows arrive in - with
    per-source counts."""
    out = np.flatnonzero(src == me)
    out = out[np.lexsort((expert[out], dst[out]))]
    inc = np.flatnonzero(dst == me)
    inc = inc[np.lexsort((expert[inc], src[inc]))]
    return (expert[out], np.bincount(dst[out], minlength=world).tolist(), expert[inc],
            np.bincount(src[inc], minlength=world).tolist())


class ExpertStore(NotCopyable, nn.Module):
    """Main instances of one layer's experts on this rank and the (global) main placement."""

    def __init__(self, ep: EPGroup, num_experts: int, hidden: int, ffn: int, capacity: int, *,
                 seed: int = 0, layer: int = 0, traffic: Optional[TrafficStats] = None) -> None:
        super().__init__()
        self.ep = ep
        self.num_experts = num_experts
        self.hidden = hidden
        self.ffn = ffn
        self.capacity = capacity
        self.traffic = traffic
        self.main_rank, self.main_slot = initial_main_placement(num_experts, ep.world_size,
                                                                capacity)
        self.w1 = nn.Parameter(torch.zeros(capacity, hidden, ffn))
        self.w3 = nn.Parameter(torch.zeros(capacity, hidden, ffn))
        self.w2 = nn.Parameter(torch.zeros(capacity, ffn, hidden))
        with torch.no_grad():
            for e in self.local_experts():
                s = int(self.main_slot[e])
                w1, w3, w2 = expert_init(seed, layer, int(e), hidden, ffn)
                self.w1[s].copy_(w1)
                self.w3[s].copy_(w3)
                self.w2[s].copy_(w2)
        self.version = 0
        self.layout_slots: Optional[np.ndarray] = None  # [G, S] of the version in force
        self.counters = MigrationCounters()
        self.fault_hook: Optional[FaultHook] = None
        self._pending: dict[int, int] = {}  # open backward windows: token -> step opened
        self._next_token = 0

    # ----------------------------------------------------------------------------- basics
    @property
    def bank(self) -> list[nn.Parameter]:
        return [self.w1, self.w3, self.w2]

    @property
    def param_row_size(self) -> int:
        return 3 * self.hidden * self.ffn

    def local_experts(self) -> np.ndarray:
        """Experts whose main instance is on this rank, ascending."""
        return np.flatnonzero(self.main_rank == self.ep.rank)

    def main_weights(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views (autograd-connected) of a local main instance: w1, w3 [H, F], w2 [F, H]."""
        if int(self.main_rank[expert]) != self.ep.rank:
            raise ValueError(f"expert {expert}'s main instance is on rank "
                             f"{int(self.main_rank[expert])}, not {self.ep.rank}")
        s = int(self.main_slot[expert])
        return self.w1[s], self.w3[s], self.w2[s]

    def _param_rows(self, slots: np.ndarray) -> torch.Tensor:
        """[n, 3 H F] flattened parameter rows of bank slots (detached copies)."""
        idx = torch.as_tensor(slots, dtype=torch.long)
        return torch.cat([p.detach().index_select(0, idx).reshape(len(slots), p[0].numel())
                          for p in self.bank], dim=1)

    def _split_row(self, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hf = self.hidden * self.ffn
        w1, w3, w2 = row.split([hf, hf, hf])  # one backward node (a cat), not three row-sized
        return (w1.view(self.hidden, self.ffn), w3.view(self.hidden, self.ffn),
                w2.view(self.ffn, self.hidden))

    # ----------------------------------------------------------------------------- backward windows
    def open_backward(self, step: int) -> int:
        """Registers a forward whose backward pass is still to run (at training step `step`);
        returns the token for :meth:`close_backward`."""
        self._pending = {t: s for t, s in self._pending.items() if s == step}
        self._next_token += 1
        self._pending[self._next_token] = step
        return self._next_token

    def close_backward(self, token: int) -> None:
        """That forward's graph can no longer be backpropagated (idempotent)."""
        self._pending.pop(token, None)

    def backward_pending(self, step: int) -> bool:
        """Whether a forward of `step` still waits for its backward pass. Windows of earlier steps
        are dropped: a step's backward passes end before its optimizer step."""
        self._pending = {t: s for t, s in self._pending.items() if s == step}
        return bool(self._pending)

    # ----------------------------------------------------------------------------- replicas
    def fetch_replicas(self, slots: np.ndarray, requires_grad: bool
                       ) -> tuple[list[Optional[tuple[torch.Tensor, ...]]], Optional[ReplicaFetch]]:
        """Weights for each of this rank's layout slots (slots [G, S]): the main instance's views
        where the main is here, else a copy of the main's parameters (every rank must call this:
        two all_to_all_single, see :class:`ReplicaFetch`; one inter-node copy per (expert,
        node)). Empty slots give None.

        Returns (weights per local slot, the fetch record for :meth:`return_replica_grads`).
        """
        g, me, per_node = self.ep.world_size, self.ep.rank, self.ep.ranks_per_node
        need_r, need_s = np.nonzero(slots >= 0)
        need_e = slots[need_r, need_s].astype(np.int64)
        need_r = need_r.astype(np.int64)
        remote = self.main_rank[need_e] != need_r
        dst, exp = need_r[remote], need_e[remote]
        src = self.main_rank[exp].astype(np.int64)
        # Relay of (expert, node) for replicas off the main's node: the node's lowest holder.
        off_node = dst // per_node != src // per_node
        relay = dst.copy()
        if off_node.any():
            key = exp * (g // per_node) + dst // per_node
            order = np.lexsort((dst, key))  # by (expert, node), then rank
            first = np.ones(order.size, dtype=bool)
            first[1:] = key[order][1:] != key[order][:-1]
            group_start = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
            relay[order] = dst[order][group_start]
        hop1 = ~off_node | (relay == dst)  # straight from the main
        # Phase 1: main -> replica on its node, or main -> relay.
        send_experts, send_splits, recv1_experts, recv_splits = _route(
            src[hop1], dst[hop1], exp[hop1], me, g)
        send = self._param_rows(self.main_slot[send_experts])
        if self.traffic is not None:
            self.traffic.record("replica_params.fwd", send_splits,
                                self.param_row_size * send.element_size())
        recv1 = exchange_rows(send, send_splits, recv_splits, self.ep.group)
        # Phase 2: relay -> the node's other replicas (NVLink).
        relayed_experts, relay_send_splits, recv2_experts, relay_recv_splits = _route(
            relay[~hop1], dst[~hop1], exp[~hop1], me, g)
        row1_of = {int(e): i for i, e in enumerate(recv1_experts)}
        relay_rows = np.array([row1_of[int(e)] for e in relayed_experts], dtype=np.int64)
        send2 = recv1.index_select(0, torch.as_tensor(relay_rows, dtype=torch.long))
        if self.traffic is not None:
            self.traffic.record("replica_params.fwd", relay_send_splits,
                                self.param_row_size * send2.element_size())
        recv2 = exchange_rows(send2, relay_send_splits, relay_recv_splits, self.ep.group)

        leaf = torch.cat([recv1, recv2]).detach()
        leaf.requires_grad_(requires_grad)
        row_of = {int(e): i for i, e in enumerate(np.concatenate([recv1_experts, recv2_experts]))}
        # Each bank tensor and the leaf split into rows by one unbind: its backward stacks the
        # rows' gradients once, where indexing row by row (p[s]) made every row's backward write a
        # zero tensor the size of the whole bank (O(slots^2) work per backward pass).
        bank_rows = [p.unbind(0) for p in self.bank]
        leaf_rows = leaf.unbind(0)
        weights: list[Optional[tuple[torch.Tensor, ...]]] = []
        for e in slots[me]:
            if e < 0:
                weights.append(None)
            elif int(self.main_rank[e]) == me:
                s = int(self.main_slot[e])
                weights.append((bank_rows[0][s], bank_rows[1][s], bank_rows[2][s]))
            else:
                weights.append(self._split_row(leaf_rows[row_of[int(e)]]))
        fetch = ReplicaFetch(leaf, send_experts, send_splits, recv_splits,
                             self.main_slot[send_experts].copy(), relay_send_splits,
                             relay_recv_splits, relay_rows)
        return weights, (fetch if requires_grad else None)

    def ensure_grads(self) -> None:
        """Gives every bank parameter that requires grad a gradient tensor (zeros where autograd
        left None), so optimizers treat all ranks' banks alike. Frozen bank tensors
        (``requires_grad=False``) get none, so optimizers leave them alone."""
        for p in self.bank:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def return_replica_grads(self, fetch: ReplicaFetch) -> None:
        """Sends each replica's gradient to its main instance and adds it there, in the fetch's
        two hops reversed: replicas relayed in phase 2 send to their relay, which adds them to
        its own replica's gradient and sends one row per (expert, node) to the main (a
        collective: every rank calls it once per fetch, in the same order). Only bank tensors
        that require grad receive gradients (a frozen w2, say, keeps ``.grad`` None)."""
        grad = fetch.leaf.grad if fetch.leaf.grad is not None else torch.zeros_like(fetch.leaf)
        n1 = int(sum(fetch.recv_splits))
        grad1, grad2 = grad[:n1], grad[n1:]
        itemsize = self.param_row_size * grad.element_size()
        if self.traffic is not None:
            self.traffic.record("replica_grads.bwd", fetch.relay_recv_splits, itemsize)
        relayed = exchange_rows(grad2, fetch.relay_recv_splits, fetch.relay_send_splits,
                                self.ep.group)
        if relayed.shape[0] > 0:
            grad1 = grad1.index_add(0, torch.as_tensor(fetch.relay_rows, dtype=torch.long),
                                    relayed)
        if self.traffic is not None:
            self.traffic.record("replica_grads.bwd", fetch.recv_splits, itemsize)
        back = exchange_rows(grad1, fetch.recv_splits, fetch.send_splits, self.ep.group)
        # Sent: a second backward through a retained graph accumulates from zero again (else the
        # main instance would receive the first pass's gradient twice).
        fetch.leaf.grad = None
        self.ensure_grads()
        if back.shape[0] == 0:
            return
        idx = torch.as_tensor(fetch.main_slot, dtype=torch.long)
        hf = self.hidden * self.ffn
        n = back.shape[0]
        parts = ((self.w1, back[:, :hf].reshape(n, self.hidden, self.ffn)),
                 (self.w3, back[:, hf:2 * hf].reshape(n, self.hidden, self.ffn)),
                 (self.w2, back[:, 2 * hf:].reshape(n, self.ffn, self.hidden)))
        with torch.no_grad():
            for p, rows in parts:
                if p.requires_grad:
                    p.grad.index_add_(0, idx, rows)

    # ----------------------------------------------------------------------------- migration
    def _moving_tensors(self, optimizer: Optional[torch.optim.Optimizer]
                        ) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor [C, ...]) of everything that belongs to one expert row by row and moves
        with its main instance: the bank parameters, their accumulated gradients (when present)
        and the optimizer state indexed by bank slot (e.g. Adam's moments). Scalar state (e.g.
        Adam's step count) is per bank tensor and identical on every rank that steps every
        iteration. Raises ValueError for state that cannot be split by slot."""
        names = ("w1", "w3", "w2")
        out: list[tuple[str, torch.Tensor]] = [(n, p.data) for n, p in zip(names, self.bank)]
        for n, p in zip(names, self.bank):
            if p.grad is not None:
                out.append((f"{n}.grad", p.grad))
        if optimizer is None:
            return out
        for n, p in zip(names, self.bank):
            state = optimizer.state.get(p, {})
            for k in sorted(state):
                v = state[k]
                # Scalars are per bank tensor; a one-element tensor shaped like the parameter
                # (a bank of one slot of 1 x 1 experts) is a row and moves.
                if not torch.is_tensor(v) or v.dim() == 0 or (v.numel() == 1 and
                                                              v.shape != p.shape):
                    continue
                if v.shape[0] != self.capacity:
                    raise ValueError(
                        f"layout change: optimizer state '{k}' of {n} has shape "
                        f"{tuple(v.shape)}, which cannot move with one expert (expected "
                        f"[{self.capacity}, ...] indexed by bank slot, or a scalar)")
                out.append((f"{n}.{k}", v))
        return out

    @staticmethod
    def _row_bytes(t: torch.Tensor, slot: int) -> torch.Tensor:
        return t[slot].detach().contiguous().view(-1).view(torch.uint8)

    def _checksum_table(self, tensors: list[tuple[str, torch.Tensor]]) -> np.ndarray:
        """[E] int64 digest of every expert's main rows (everything that moves), gathered from
        the main ranks (a collective)."""
        table = torch.zeros(self.num_experts, dtype=torch.int64)
        for e in self.local_experts():
            slot = int(self.main_slot[e])
            table[int(e)] = digest([t[slot] for _, t in tensors])
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=self.ep.group)
        return table.numpy()

    def _agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.ep.group)
        return bool(flag.item())

    def _migration_problem(self, optimizer: Optional[torch.optim.Optimizer],
                           optimizer_attached: bool) -> Optional[str]:
        """Why main instances cannot move with this rank's optimizer (None: they can)."""
        trainable = [(n, p) for n, p in zip(("w1", "w3", "w2"), self.bank) if p.requires_grad]
        if not trainable:
            return None
        if not optimizer_attached:
            return ("main instances move, but no optimizer is attached: call "
                    "runtime.attach_optimizer(opt) on every rank with the optimizer that steps "
                    "the expert bank, so its state moves with them (attach_optimizer(None) if "
                    "it keeps no per-parameter state, or freeze the bank)")
        if optimizer is None:
            return None
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [n for n, p in trainable if id(p) not in held]
        if missing:
            return (f"the attached {type(optimizer).__name__} does not hold the expert bank's "
                    f"{', '.join(missing)}: attach the optimizer that steps the expert bank")
        return None

    def _check_row_layout(self, tensors: list[tuple[str, torch.Tensor]],
                          row_bytes: list[int]) -> None:
        """Every rank must move rows of the same parts, dtypes, shapes and width (else the
        exchange would mismatch or write bytes into the wrong tensor)."""
        signature = ";".join(f"{n}:{t.dtype}:{tuple(t.shape[1:])}" for n, t in tensors)
        mine = torch.tensor([len(tensors), sum(row_bytes), zlib.crc32(signature.encode())],
                            dtype=torch.int64)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.ep.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.ep.group)
        if not torch.equal(lo, hi):
            raise RuntimeError(
                "layout change: ranks hold different optimizer state or gradients for the expert "
                f"bank (this rank: {[n for n, _ in tensors]}); attach the same optimizer on every "
                "rank, step it and zero gradients on every rank")

    def apply_layout(self, slots: np.ndarray, optimizer: Optional[torch.optim.Optimizer], *,
                     optimizer_attached: bool = True) -> bool:
        """Makes `slots` [G, S] the layout in force (a new version). Main instances whose rank
        does not hold their expert move, with their gradient and optimizer state rows, as
        described in the module docstring. A collective: every rank calls it with the same
        layout. Must not be called while a backward pass is pending (:meth:`backward_pending`).

        `optimizer_attached` False (no optimizer declared) refuses to move the mains of a
        trainable bank; so does an `optimizer` that does not hold the bank's trainable
        parameters. Such problems, and optimizer state that cannot move by slot, raise ValueError
        on every rank before anything moves.

        Returns True when the new version is in force, False after a rollback (the previous
        placement, parameters, gradients and optimizer state are intact; replicas are fetched
        from wherever the mains are, so execution stays correct either way).
        """
        g, me = self.ep.world_size, self.ep.rank
        new_rank, new_slot = follow_layout(slots, self.ep.ranks_per_node, self.main_rank,
                                           self.main_slot, self.capacity)
        movers = np.flatnonzero(new_rank != self.main_rank)
        if movers.shape[0] == 0:
            self.main_slot = new_slot
            self._commit_version(slots)
            return True
        problem = self._migration_problem(optimizer, optimizer_attached)
        tensors: list[tuple[str, torch.Tensor]] = []
        if problem is None:
            try:
                tensors = self._moving_tensors(optimizer)
            except ValueError as exc:
                problem = str(exc)
        agree_on_errors(self.ep, problem, "layout change")
        row_bytes = [t[0].numel() * t.element_size() for _, t in tensors]
        self._check_row_layout(tensors, row_bytes)
        before = self._checksum_table(tensors)

        send_e = movers[self.main_rank[movers] == me]
        send_e = send_e[np.lexsort((send_e, new_rank[send_e]))]
        recv_e = movers[new_rank[movers] == me]
        recv_e = recv_e[np.lexsort((recv_e, self.main_rank[recv_e]))]
        send_splits = np.bincount(new_rank[send_e], minlength=g).tolist()
        recv_splits = np.bincount(self.main_rank[recv_e], minlength=g).tolist()
        width = sum(row_bytes)
        send = torch.zeros(len(send_e), width, dtype=torch.uint8)
        for i, e in enumerate(send_e):
            slot = int(self.main_slot[e])
            send[i] = torch.cat([self._row_bytes(t, slot) for _, t in tensors])
        if self.traffic is not None:
            self.traffic.record("migration", send_splits, width)
        recv = exchange_rows(send, send_splits, recv_splits, self.ep.group)
        if self.fault_hook is not None:
            self.fault_hook("migration.recv", recv)

        # Verify every arriving row against the checksum taken at its old main rank.
        bounds = np.cumsum([0] + row_bytes)
        rows_ok = all(
            digest([recv[i, bounds[j]:bounds[j + 1]] for j in range(len(row_bytes))])
            == int(before[e])
            for i, e in enumerate(recv_e)
        )
        if not self._agree(rows_ok):
            self.counters.rollbacks += 1
            self.counters.last_error = "layout change: a migrated row failed its checksum"
            return False

        old_rank, old_slot = self.main_rank.copy(), self.main_slot.copy()
        # Only the vacated and arriving slots are written: they are all a rollback restores.
        touched = torch.as_tensor(np.unique(np.concatenate(
            [old_slot[send_e], new_slot[recv_e]])).astype(np.int64))
        backup = [t[touched].clone() for _, t in tensors]
        with torch.no_grad():
            for e in send_e:  # vacate first: an arriving main may reuse the slot
                self._write_row(int(old_slot[e]), None, tensors, bounds)
            for i, e in enumerate(recv_e):
                self._write_row(int(new_slot[e]), recv[i], tensors, bounds)
        self.main_rank, self.main_slot = new_rank, new_slot
        after = self._checksum_table(tensors)
        if not np.array_equal(after, before):
            with torch.no_grad():
                for (_, t), b in zip(tensors, backup):
                    t[touched] = b
            self.main_rank, self.main_slot = old_rank, old_slot
            self.counters.rollbacks += 1
            self.counters.last_error = "layout change: checksums differ after the commit"
            return False
        node = self.ep.ranks_per_node
        cross = int(np.sum(old_rank[movers] // node != new_rank[movers] // node))
        self.counters.main_moves_cross_node += cross
        self.counters.main_moves_intra_node += int(movers.shape[0]) - cross
        self._commit_version(slots)
        return True

    @staticmethod
    def _write_row(slot: int, row: Optional[torch.Tensor],
                   tensors: list[tuple[str, torch.Tensor]], bounds: np.ndarray) -> None:
        """Writes a migrated row (its parts' bytes, in `tensors` order) into bank slot `slot`, or
        zeros."""
        for j, (_, t) in enumerate(tensors):
            target = t[slot]
            if row is None:
                target.zero_()
            else:
                part = row[int(bounds[j]):int(bounds[j + 1])].clone().view(t.dtype)
                target.copy_(part.view(target.shape))

    def _commit_version(self, slots: np.ndarray) -> None:
        self.layout_slots = np.array(slots, copy=True)
        self.version += 1
        self.counters.versions_applied += 1

    def placement_digest(self) -> int:
        """int64 digest of the main placement and version (equal on every rank that agrees)."""
        h = hashlib.blake2b(digest_size=8)
        h.update(np.ascontiguousarray(self.main_rank, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(self.main_slot, dtype=np.int64).tobytes())
        h.update(int(self.version).to_bytes(8, "little", signed=True))
        return int.from_bytes(h.digest(), "little", signed=True)

    # ----------------------------------------------------------------------------- checkpoints
    def get_extra_state(self) -> dict:
        """The main placement and version (saved in ``state_dict`` next to the bank rows, as
        tensors and plain values, so ``torch.load(weights_only=True)`` reads it)."""
        return {
            "format": "cobalt.ExpertStore/1",
            "num_experts": self.num_experts,
            "world_size": self.ep.world_size,
            "capacity": self.capacity,
            "rank": self.ep.rank,
            "main_rank": torch.from_numpy(self.main_rank.astype(np.int64)),
            "main_slot": torch.from_numpy(self.main_slot.astype(np.int64)),
            "version": self.version,
            "layout_slots": None if self.layout_slots is None else
            torch.from_numpy(np.asarray(self.layout_slots, dtype=np.int64)),
        }

    def _parse_extra_state(self, state: object
                           ) -> tuple[np.ndarray, np.ndarray, int, Optional[np.ndarray]]:
        """(main_rank, main_slot, version, layout_slots) of a saved extra state; raises
        ValueError when it was written for another number of experts, world size or capacity,
        or is malformed."""
        if not isinstance(state, dict) or state.get("format") != "cobalt.ExpertStore/1":
            raise ValueError("ExpertStore checkpoint: unknown extra-state format")
        missing = [key for key in ("num_experts", "world_size", "capacity", "main_rank",
                                   "main_slot", "version", "layout_slots") if key not in state]
        if missing:
            raise ValueError(f"ExpertStore checkpoint: the extra state lacks {', '.join(missing)}")
        for key, mine in (("num_experts", self.num_experts), ("world_size", self.ep.world_size),
                          ("capacity", self.capacity)):
            if int(state[key]) != mine:
                raise ValueError(f"ExpertStore checkpoint: saved with {key} = {state[key]}, this "
                                 f"store has {mine}")
        # Checkpoints from before the rank was saved carry none (they cannot be checked).
        if "rank" in state and int(state["rank"]) != self.ep.rank:
            raise ValueError(f"ExpertStore checkpoint: saved by rank {int(state['rank'])}, loaded "
                             f"on rank {self.ep.rank} (each rank's bank holds its own experts: "
                             "every rank saves and loads its own file)")
        main_rank = np.asarray(state["main_rank"], dtype=np.int64)
        main_slot = np.asarray(state["main_slot"], dtype=np.int64)
        if main_rank.shape != (self.num_experts,) or main_slot.shape != (self.num_experts,) or \
                main_rank.min(initial=0) < 0 or main_rank.max(initial=0) >= self.ep.world_size or \
                main_slot.min(initial=0) < 0 or main_slot.max(initial=0) >= self.capacity:
            raise ValueError("ExpertStore checkpoint: main placement out of range")
        if np.unique(main_rank * self.capacity + main_slot).shape[0] != self.num_experts:
            raise ValueError("ExpertStore checkpoint: two experts share a bank slot")
        saved = state["layout_slots"]
        layout_slots = None if saved is None else np.array(np.asarray(saved), dtype=np.int64)
        return main_rank.copy(), main_slot.copy(), int(state["version"]), layout_slots

    def set_extra_state(self, state: dict) -> None:
        """Restores the placement saved with the bank rows (see :meth:`_parse_extra_state`)."""
        self.main_rank, self.main_slot, self.version, self.layout_slots = \
            self._parse_extra_state(state)
        self._pending.clear()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        # The placement is checked before any bank row is copied (torch copies the parameters
        # first and calls set_extra_state last): a refused placement changes nothing in this
        # store. Modules loaded before it are loaded already (ExpertParallelMoE checks before
        # its router; check_checkpoint checks a whole model before load_state_dict).
        self.check_placement_saved(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)  # type: ignore[arg-type]

    def check_placement_saved(self, state_dict: dict, prefix: str) -> None:
        """Raises ValueError when `state_dict` holds this store's extra state (at `prefix`) that
        does not fit it, bank rows without it (rows whose experts cannot be placed), or the
        placement without all of its bank rows w1, w3, w2 of this store's shapes: torch would
        apply the placement and skip the rows it lacks, leaving rows the placement does not
        describe (also when load_state_dict then raises on a shape)."""
        key = prefix + "_extra_state"
        if key in state_dict:
            self._parse_extra_state(state_dict[key])
            absent = [prefix + n for n in ("w1", "w3", "w2") if prefix + n not in state_dict]
            if absent:
                raise ValueError(f"ExpertStore checkpoint: has '{key}' (the main placement) but no "
                                 f"{', '.join(absent)}: a placement loads with all its bank rows "
                                 "(leave the placement out too to keep this store as it is)")
            for name, param in zip(("w1", "w3", "w2"), self.bank):
                saved = state_dict[prefix + name]
                if not torch.is_tensor(saved) or tuple(saved.shape) != tuple(param.shape):
                    shape = list(saved.shape) if torch.is_tensor(saved) else type(saved).__name__
                    raise ValueError(f"ExpertStore checkpoint: '{prefix + name}' has shape "
                                     f"{shape}, this store {list(param.shape)}")
            return
        rows = [prefix + n for n in ("w1", "w3", "w2") if prefix + n in state_dict]
        if rows:
            raise ValueError(f"ExpertStore checkpoint: has {', '.join(rows)} but no '{key}' (the "
                             "main placement saying which expert each bank row holds)")

    def load_main_weights(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> None:
        """The inverse of :meth:`gather_main_weights`: every expert's weights, w1, w3 [E, H, F]
        and w2 [E, F, H] (the same on every rank), into the bank rows of this rank's main
        instances (no collective; replicas copy the mains at their next forward). Optimizer state
        is left as it is. Not while a forward waits for its backward pass (the caller checks)."""
        for name, given, param in zip(("w1", "w3", "w2"), (w1, w3, w2), self.bank):
            want = [self.num_experts] + list(param.shape[1:])
            if not isinstance(given, torch.Tensor) or list(given.shape) != want:
                shape = list(given.shape) if isinstance(given, torch.Tensor) else \
                    type(given).__name__
                raise ValueError(f"ExpertStore.load_main_weights: {name} has shape {shape}, "
                                 f"expected {want} ([E, H, F] for w1 and w3, [E, F, H] for w2)")
            if not given.dtype.is_floating_point:
                raise ValueError(f"ExpertStore.load_main_weights: {name} has dtype "
                                 f"{given.dtype}, expected a floating dtype")
        experts = torch.as_tensor(self.local_experts(), dtype=torch.long)
        slots = torch.as_tensor(self.main_slot[self.local_experts()], dtype=torch.long)
        with torch.no_grad():
            for given, param in zip((w1, w3, w2), self.bank):
                param[slots] = given.detach()[experts].to(device=param.device, dtype=param.dtype)

    def gather_main_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every expert's main parameters on every rank: w1, w3 [E, H, F], w2 [E, F, H]
        (a collective; bit for bit: each row comes from its main's rank alone)."""
        out = [torch.zeros((self.num_experts,) + tuple(p.shape[1:]), dtype=p.dtype)
               for p in self.bank]
        with torch.no_grad():
            for e in self.local_experts():
                for o, p in zip(out, self.bank):
                    o[int(e)] = p[int(self.main_slot[e])]
        for o in out:
            all_reduce_disjoint_(o, self.ep.group)
        return out[0], out[1], out[2]


def check_checkpoint(module: nn.Module, state_dict: dict, *, strict: bool = True) -> None:
    """Checks that `state_dict` (as ``module.state_dict()`` writes it) fits every
    :class:`ExpertStore` inside `module`, without loading anything: each store's saved main
    placement (number of experts, world size, bank capacity, placement in range, one expert per
    bank slot, saved by this rank) and the shapes of its bank tensors w1, w3, w2. Bank tensors
    without the placement are refused; with `strict`, so is a store whose extra state or bank
    tensors are missing.

    ``load_state_dict`` refuses such a checkpoint as well, but only when it reaches the store
    (and the layer that holds it): the modules it loaded before are changed by then. Call this
    first (on every rank: each rank checks its own bank; no collective) to refuse a checkpoint
    while nothing has changed. Raises ValueError naming the store and what does not fit.
    """
    for name, store in module.named_modules():
        if not isinstance(store, ExpertStore):
            continue
        prefix = f"{name}." if name else ""
        where = f"check_checkpoint: ExpertStore '{name}'" if name else \
            "check_checkpoint: ExpertStore"
        key = prefix + "_extra_state"
        if key in state_dict:
            try:
                store._parse_extra_state(state_dict[key])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{where}: {exc}") from exc
            absent = [prefix + n for n in ("w1", "w3", "w2") if prefix + n not in state_dict]
            if absent:
                # Even without `strict`: the placement would be applied to rows it does not
                # describe (load_state_dict refuses it).
                raise ValueError(f"{where}: the checkpoint has '{key}' (the main placement) but no "
                                 f"{', '.join(absent)}")
        elif strict or any(prefix + n in state_dict for n in ("w1", "w3", "w2")):
            # Bank rows without their placement cannot be placed (load_state_dict refuses them).
            raise ValueError(f"{where}: the checkpoint has no '{key}' (the main placement)")
        for pname, p in zip(("w1", "w3", "w2"), store.bank):
            saved = state_dict.get(prefix + pname)
            if saved is None:
                if strict:
                    raise ValueError(f"{where}: the checkpoint has no '{prefix + pname}'")
                continue
            if tuple(saved.shape) != tuple(p.shape):
                raise ValueError(f"{where}: '{prefix + pname}' has shape {list(saved.shape)}, "
                                 f"this store {list(p.shape)}")
