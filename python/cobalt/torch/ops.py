"""Cobalt's per-step operations on torch tensors, on the tensors' device.

CUDA tensors run the CUDA kernels (:mod:`cobalt.cuda`: ``data_ptr()`` and the current stream, no
host round trip); CPU tensors run the C++ CPU references. Both give the same integers, so a
training stack can call these on whatever device its router runs on:

* :func:`assign_tasks` - Cobalt Algorithm 1 (execution rank of every token-expert task);
* :func:`routing_counts` - per-expert loads and pairwise co-activation counts of a batch;
* :func:`dispatch_layout` - per-rank / per-node token counts, DeepEP's ``is_token_in_rank``,
  send-buffer slots and offsets of an assignment;
* :func:`solve_topoep` - TopoEP's per-microbatch replica/routing plan.

Inputs on CUDA are trusted by the kernels (ids in range, distinct per row); pass
``validate=True`` to check them first (a device-to-host sync). CPU inputs are always validated.
int64 inputs (what ``torch.topk`` returns) are narrowed to int32: values outside int32 are an error
(always on CPU, where the narrowing is one checked pass in C++; with ``validate=True`` on CUDA).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch

import cobalt
import cobalt.cuda as cuda

__all__ = ["assign_tasks", "routing_counts", "dispatch_layout", "DispatchLayout", "solve_topoep",
           "TopoEpPlan"]

DispatchLayout = cuda.DispatchLayout

_SEARCH = {"auto": cobalt.CoverSearch.AUTO, "masks": cobalt.CoverSearch.MASK_ENUMERATION,
           "subset_dp": cobalt.CoverSearch.SUBSET_DP}


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_int32_range(t: torch.Tensor, name: str) -> None:
    if t.dtype == torch.int64 and t.numel() > 0:
        lo, hi = int(t.min()), int(t.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            raise ValueError(f"cobalt.torch.ops: {name} holds {lo if lo < _INT32_MIN else hi}, "
                             f"outside int32 [{_INT32_MIN}, {_INT32_MAX}]")


def _require_int_tensor(t: torch.Tensor, name: str) -> None:
    """TypeError unless t is a tensor, ValueError unless it holds int32 or int64 (on either device:
    a float or bool id, rank or count would be truncated by a cast)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cobalt.torch.ops: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cobalt.torch.ops: {name} must be int32 or int64, got {t.dtype}")


def _host_ints(t: torch.Tensor, name: str) -> np.ndarray:
    """The numpy view of CPU tensor t (no copy). The bindings narrow int64 to int32 in one
    checked pass (values outside int32 are an error naming the range), so nothing is cast here."""
    _require_int_tensor(t, name)
    return t.detach().numpy()


def _check_threads(num_threads: int) -> None:
    if not isinstance(num_threads, int) or num_threads < 0:
        raise ValueError(f"cobalt.torch.ops: num_threads must be an int >= 0 (0: one per core), "
                         f"got {num_threads!r}")


def _validate_ids(topk_ids: torch.Tensor, num_experts: int) -> None:
    if topk_ids.numel() == 0:
        return
    _check_int32_range(topk_ids, "topk_ids")
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= num_experts:
        raise ValueError(f"cobalt.torch.ops: expert id {lo if lo < 0 else hi} out of range "
                         f"[0, {num_experts})")
    if topk_ids.shape[1] > 1:
        ordered = torch.sort(topk_ids, dim=1).values
        if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
            raise ValueError("cobalt.torch.ops: a token selects the same expert twice")


def _validate_ranks(ranks: torch.Tensor, num_ranks: int, name: str) -> None:
    if ranks.numel() == 0:
        return
    _check_int32_range(ranks, name)
    lo, hi = int(ranks.min()), int(ranks.max())
    if lo < 0 or hi >= num_ranks:
        raise ValueError(f"cobalt.torch.ops: {name} {lo if lo < 0 else hi} out of range "
                         f"[0, {num_ranks})")


def assign_tasks(topk_ids: torch.Tensor, source_rank: torch.Tensor,
                 layout: Union[cobalt.ExpertLayout, cuda.DeviceLayout], *, seed: int = 0,
                 step: int = 0, layer: int = 0, token_offset: int = 0, search: str = "auto",
                 validate: bool = False, num_threads: int = 1) -> torch.Tensor:
    """Execution rank [T, K] int32 of every task of topk_ids [T, K] (tokens of source_rank [T]),
    on topk_ids' device: Cobalt Algorithm 1 keyed by (seed, step, layer, token_offset + t, k).

    On CUDA pass a :class:`cobalt.cuda.DeviceLayout` to reuse the uploaded layout across steps
    (an ExpertLayout is uploaded on every call, which synchronises the stream). On CPU,
    num_threads threads share the tokens (0: one per core); the ranks do not depend on it (ignored
    on CUDA).
    """
    _check_threads(num_threads)
    if search not in _SEARCH:
        raise ValueError(f"cobalt.torch.ops: unknown cover search {search!r} "
                         f"(valid: {', '.join(_SEARCH)})")
    _require_int_tensor(topk_ids, "topk_ids")
    _require_int_tensor(source_rank, "source_rank")
    host_layout = layout.layout if isinstance(layout, cuda.DeviceLayout) else layout
    if not isinstance(host_layout, cobalt.ExpertLayout):
        raise TypeError(f"cobalt.torch.ops: layout must be a cobalt.ExpertLayout or "
                        f"cobalt.cuda.DeviceLayout, got {type(layout).__name__}")
    if topk_ids.device.type == "cuda":
        if validate:
            _validate_ids(topk_ids, host_layout.num_experts)
            _validate_ranks(source_rank, host_layout.num_ranks, "source rank")
        return cuda.assign_node_cover(topk_ids.to(torch.int32).contiguous(),
                                      source_rank.to(torch.int32).contiguous(), layout, seed=seed,
                                      step=step, layer=layer, token_offset=token_offset,
                                      search=search)
    batch = cobalt.RoutingBatch(_host_ints(topk_ids, "topk_ids"),
                                _host_ints(source_rank, "source_rank"), host_layout.num_experts,
                                host_layout.num_ranks)
    exec_rank = cobalt.assign_node_cover(batch, host_layout, seed=seed, step=step, layer=layer,
                                         token_offset=token_offset, search=_SEARCH[search],
                                         num_threads=num_threads)
    return torch.from_numpy(exec_rank)


def routing_counts(topk_ids: torch.Tensor, num_experts: int, *, method: str = "auto",
                   validate: bool = False,
                   num_threads: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert_counts [E] int64, coactivation [E, E] int64) of topk_ids [T, K] on its device.
    method picks the CUDA histogram variant (auto, shared, shared_plain, global; ignored on CPU);
    num_threads the CPU threads (0: one per core; the counts do not depend on it; ignored on
    CUDA)."""
    _check_threads(num_threads)
    _require_int_tensor(topk_ids, "topk_ids")
    if topk_ids.device.type == "cuda":
        if validate:
            _validate_ids(topk_ids, num_experts)
        return cuda.count_routing(topk_ids.to(torch.int32).contiguous(), num_experts,
                                  method=method)
    ids = _host_ints(topk_ids, "topk_ids")
    if ids.ndim != 2:
        raise ValueError(f"cobalt.torch.ops: topk_ids must be [T, K], got shape {list(ids.shape)}")
    # One rank: the source ranks (all 0) are made by the batch, not copied in.
    batch = cobalt.RoutingBatch(ids, None, num_experts, 1)
    counts, coact = cobalt.count_routing(batch, num_threads=num_threads)
    return torch.from_numpy(np.array(counts)), torch.from_numpy(np.array(coact))


def dispatch_layout(exec_rank: torch.Tensor, source_rank: torch.Tensor, topology: cobalt.Topology,
                    *, validate: bool = False,
                    workspace: Optional[cobalt.DispatchLayoutWorkspace] = None) -> DispatchLayout:
    """The dispatch layout of exec_rank [T, K] (tokens of source_rank [T]) on its device: every
    field of :class:`cobalt.cuda.DispatchLayout` (slot, token_in_rank and pair_counts included).

    On CPU, a :class:`cobalt.DispatchLayoutWorkspace` (made once for the largest batch) keeps the
    C++ buffers across steps: the tensors returned are then views of it that the next call with
    the same workspace overwrites, and must not be written (clone what must outlive the step). On
    CUDA the workspace is not used: the outputs come from torch's caching allocator."""
    _require_int_tensor(exec_rank, "exec_rank")
    _require_int_tensor(source_rank, "source_rank")
    if exec_rank.device.type == "cuda":
        if validate:
            _validate_ranks(exec_rank, topology.num_ranks, "execution rank")
            _validate_ranks(source_rank, topology.num_ranks, "source rank")
        return cuda.dispatch_layout(exec_rank.to(torch.int32).contiguous(), topology.num_nodes,
                                    topology.num_ranks,
                                    source_rank=source_rank.to(torch.int32).contiguous(),
                                    pair_counts=True)
    if workspace is not None and not isinstance(workspace, cobalt.DispatchLayoutWorkspace):
        raise TypeError(f"cobalt.torch.ops: workspace must be a cobalt.DispatchLayoutWorkspace, "
                        f"got {type(workspace).__name__}")
    d = cobalt.dispatch_layout(_host_ints(exec_rank, "exec_rank"),
                               _host_ints(source_rank, "source_rank"), topology,
                               workspace=workspace)
    if workspace is None:
        # The arrays own their C++ buffers (writable): shared with torch, not copied.
        return DispatchLayout(**{k: torch.from_numpy(v) for k, v in d.items()})
    # Read-only views of the workspace, shared with torch as they are (no copy): torch warns that
    # it cannot mark a tensor read-only, which the docstring says instead.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return DispatchLayout(**{k: torch.from_numpy(v) for k, v in d.items()})


@dataclass
class TopoEpPlan:
    """TopoEP's plan with its quotas trimmed to the plan's (grouped by source rank)."""

    slots: torch.Tensor  # [G, S] int32, -1 empty
    source_offsets: torch.Tensor  # [G + 1] int64
    quota_expert: torch.Tensor  # [Q] int32
    quota_dst: torch.Tensor  # [Q] int32
    quota_count: torch.Tensor  # [Q] int64
    rank_loads: torch.Tensor  # [G] int64
    stats: torch.Tensor  # [4] int64: inter-node, intra-node replicas, moves, dropped replicas


def solve_topoep(demand: torch.Tensor, topology: cobalt.Topology, slots_per_rank: int, *,
                 token_bytes: float, expert_param_bytes: float,
                 max_moves_per_node: int = 4096) -> TopoEpPlan:
    """TopoEP's per-microbatch plan for demand Omega [G, E] on its device. On CUDA this reads the
    status word and the quota count back (one sync) and raises ValueError for negative demand,
    like the CPU solver; the CUDA solver also raises RuntimeError when a node needs more than
    `max_moves_per_node` refinement moves (its move log's capacity; the CPU solver has no such
    limit and ignores the argument)."""
    _require_int_tensor(demand, "demand")
    if demand.device.type == "cuda":
        p = cuda.solve_topoep(demand.to(torch.int64).contiguous(), topology.num_nodes,
                              slots_per_rank, token_bytes=token_bytes,
                              expert_param_bytes=expert_param_bytes,
                              max_moves_per_node=max_moves_per_node).check()
        q = int(p.source_offsets[-1])
        # Copies: the views would keep the whole G * G * S quota buffer alive.
        return TopoEpPlan(p.slots, p.source_offsets, p.quota_expert[:q].clone(),
                          p.quota_dst[:q].clone(), p.quota_count[:q].clone(), p.rank_loads,
                          p.stats)
    d = cobalt.solve_topoep(np.ascontiguousarray(demand.detach().numpy(), dtype=np.int64),
                            topology, slots_per_rank, token_bytes, expert_param_bytes)
    return TopoEpPlan(**{k: torch.from_numpy(np.array(v)) for k, v in d.items()})
