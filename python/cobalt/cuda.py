"""Cobalt's CUDA kernels on torch CUDA tensors (docs/gpu.md).

Each function takes CUDA tensors, checks their device, dtype, shape and contiguity, allocates its
outputs and workspace on the same device (through torch's caching allocator) and enqueues the
kernels on the device's current stream (``torch.cuda.current_stream()``): no host
synchronisation, except :class:`DeviceLayout`'s upload and release (``cudaFree`` waits for the
device: keep one per layout version rather than passing an ExpertLayout on every call) and
:meth:`TopoEpPlan.check`. Results are
bitwise identical to the CPU references in :mod:`cobalt` (``assign_node_cover``,
``count_routing``, ``dispatch_layout``, ``solve_topoep``); :mod:`cobalt.torch.ops` picks the GPU
or the CPU path by the tensors' device.

The kernels exist when Cobalt was built with nvcc (``make test-cuda-compile`` builds
``cobalt/_cuda*.so``); :func:`is_available` says whether they can run here (module built, torch
with CUDA, a device visible). Calling a kernel where they cannot raises RuntimeError.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import torch

import cobalt

try:  # built only with nvcc
    from cobalt import _cuda  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _cuda = None

__all__ = ["is_built", "is_available", "DeviceLayout", "assign_node_cover", "count_routing",
           "DispatchLayout", "dispatch_layout", "TopoEpPlan", "solve_topoep"]

_SEARCH_NAMES = {"auto": "auto", "masks": "masks", "subset_dp": "subset_dp"}
_METHODS = ("auto", "shared", "shared_plain", "global")


def is_built() -> bool:
    """Whether the extension cobalt._cuda exists (Cobalt was built with nvcc)."""
    return _cuda is not None


def is_available() -> bool:
    """Whether the kernels can run here: cobalt._cuda built, torch built with CUDA, a device."""
    return _cuda is not None and torch.cuda.is_available() and bool(_cuda.device_available())


def _module() -> Any:
    if _cuda is None:
        raise RuntimeError("cobalt.cuda: Cobalt was built without CUDA (cobalt._cuda is missing; "
                           "build with nvcc present: make test-cuda-compile)")
    return _cuda


def _require_available() -> None:
    if not is_available():
        raise RuntimeError(
            "cobalt.cuda: no usable CUDA device (cobalt._cuda built: "
            f"{_cuda is not None}, torch with CUDA: {torch.cuda.is_available()}, device visible "
            f"to the CUDA runtime: {bool(_cuda is not None and _cuda.device_available())})")


def _require(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[Optional[int], ...],
             device: Optional[torch.device] = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cobalt.cuda: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"cobalt.cuda: {name} must be a CUDA tensor, got device {t.device} "
                         "(cobalt.torch.ops runs CPU tensors on the CPU reference)")
    if device is not None and t.device != device:
        raise ValueError(f"cobalt.cuda: {name} is on {t.device}, expected {device}")
    if t.dtype != dtype:
        raise ValueError(f"cobalt.cuda: {name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and t.shape[i] != s
                                    for i, s in enumerate(shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"cobalt.cuda: {name} must have shape [{want}], got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"cobalt.cuda: {name} must be contiguous")


def _cuda_device(device: Union[torch.device, str, int, None]) -> torch.device:
    """The device with its index ("cuda" means the current device)."""
    d = torch.device("cuda", torch.cuda.current_device()) if device is None \
        else torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"cobalt.cuda: expected a CUDA device, got {d}")
    return d if d.index is not None else torch.device("cuda", torch.cuda.current_device())


def _stream(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def _workspace(nbytes: int, device: torch.device) -> tuple[torch.Tensor, int]:
    buf = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)
    return buf, int(buf.data_ptr())


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else int(t.data_ptr())


class DeviceLayout:
    """An :class:`cobalt.ExpertLayout`'s lookup maps on a CUDA device. Upload once per layout
    change (the copy synchronises the current stream), reuse for every step's assignment."""

    def __init__(self, layout: cobalt.ExpertLayout,
                 device: Union[torch.device, str, int, None] = None) -> None:
        _require_available()
        self.layout = layout
        self.device = _cuda_device(device)
        with torch.cuda.device(self.device):
            self._handle = _module().DeviceLayout(
                layout.topology.num_nodes, layout.num_ranks, layout.num_experts,
                np.ascontiguousarray(layout.slots, dtype=np.int32), _stream(self.device))


def _int_in(value: Any, name: str, low: int, high: int, valid: str) -> int:
    """`value` as an int in [low, high] (numpy integers too), else the CPU binding's error."""
    number = operator.index(value)
    if not low <= number <= high:
        raise cobalt.InvalidArgumentError(f"{name} {number} out of range {valid}")
    return number


def assign_node_cover(topk_ids: torch.Tensor, source_rank: torch.Tensor,
                      layout: Union[cobalt.ExpertLayout, DeviceLayout], *, seed: int = 0,
                      step: int = 0, layer: int = 0, token_offset: int = 0,
                      search: Union[str, "cobalt.CoverSearch"] = "auto",
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Cobalt Algorithm 1 on the GPU: exec_rank [T, K] int32, bitwise equal to
    ``cobalt.assign_node_cover(batch, layout, seed, step, layer, token_offset, search)``.

    topk_ids [T, K] int32 (K <= 16; ids distinct per row, in [0, E)), source_rank [T] int32 in
    [0, G): trusted, as the kernel does not validate them (the CPU path does).
    """
    key = (_int_in(seed, "seed", 0, 2**64 - 1, "[0, 2^64 - 1]"),
           _int_in(step, "step", -2**63, 2**63 - 1, "for a 64-bit integer [-2^63, 2^63 - 1]"),
           _int_in(layer, "layer", -2**31, 2**31 - 1,
                   "for a 32-bit integer [-2147483648, 2147483647]"),
           _int_in(token_offset, "token_offset", -2**63, 2**63 - 1,
                   "for a 64-bit integer [-2^63, 2^63 - 1]"))
    _require(topk_ids, "topk_ids", torch.int32, (None, None))
    num_tokens, top_k = int(topk_ids.shape[0]), int(topk_ids.shape[1])
    device = _cuda_device(topk_ids.device)
    dl = layout if isinstance(layout, DeviceLayout) else DeviceLayout(layout, device)
    if dl.device != device:
        raise ValueError(f"cobalt.cuda: layout is on {dl.device}, topk_ids on {device}")
    _require(source_rank, "source_rank", torch.int32, (num_tokens,), device)
    if out is None:
        out = torch.empty((num_tokens, top_k), dtype=torch.int32, device=device)
    _require(out, "out", torch.int32, (num_tokens, top_k), device)
    name = _search_name(search)
    m = _module()
    ws_bytes = m.assign_workspace_bytes(num_tokens, top_k, dl.layout.topology.num_nodes, name)
    ws, ws_ptr = _workspace(ws_bytes, device)
    with torch.cuda.device(device):
        m.assign_node_cover(dl._handle, _ptr(topk_ids), _ptr(source_rank), num_tokens, top_k,
                            *key, name, _ptr(out),
                            ws_ptr, ws_bytes, _stream(device))
    del ws  # freed to torch's caching allocator: its reuse is ordered after the kernels
    return out


def _search_name(search: Any) -> str:
    if isinstance(search, str):
        key = search
    else:  # cobalt.CoverSearch
        key = {"AUTO": "auto", "MASK_ENUMERATION": "masks", "SUBSET_DP": "subset_dp"}.get(
            getattr(search, "name", ""), "")
    if key not in _SEARCH_NAMES:
        raise ValueError(f"cobalt.cuda: unknown cover search {search!r} "
                         f"(valid: {', '.join(_SEARCH_NAMES)} or a cobalt.CoverSearch)")
    return _SEARCH_NAMES[key]


def count_routing(topk_ids: torch.Tensor, num_experts: int, *,
                  method: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(expert_counts [E] int64, coactivation [E, E] int64) of topk_ids [T, K] int32 on the GPU,
    equal to ``cobalt.count_routing``. method: auto, shared, shared_plain or global."""
    _require(topk_ids, "topk_ids", torch.int32, (None, None))
    if method not in _METHODS:
        raise ValueError(f"cobalt.cuda: unknown statistics method {method!r} "
                         f"(valid: {', '.join(_METHODS)})")
    device = topk_ids.device
    num_tokens, top_k = int(topk_ids.shape[0]), int(topk_ids.shape[1])
    m = _module()
    counts = torch.empty(num_experts, dtype=torch.int64, device=device)
    coact = torch.empty((num_experts, num_experts), dtype=torch.int64, device=device)
    with torch.cuda.device(device):
        ws_bytes = m.routing_counts_workspace_bytes(num_tokens, top_k, num_experts, method)
        ws, ws_ptr = _workspace(ws_bytes, device)
        m.count_routing(_ptr(topk_ids), num_tokens, top_k, num_experts, _ptr(counts),
                        _ptr(coact), ws_ptr, ws_bytes, _stream(device), method)
    del ws
    return counts, coact


@dataclass
class DispatchLayout:
    """What a DeepEP-style exchange needs (definitions: include/cobalt/assign/dispatch_layout.hpp).
    slot, token_in_rank and pair_counts are None when not requested."""

    rank_counts: torch.Tensor  # [G] int64
    node_counts: torch.Tensor  # [N] int64
    rank_offsets: torch.Tensor  # [G + 1] int64
    slot: Optional[torch.Tensor] = None  # [T, K] int32
    token_in_rank: Optional[torch.Tensor] = None  # [T, G] uint8
    pair_counts: Optional[torch.Tensor] = None  # [G, G] int64


def dispatch_layout(exec_rank: torch.Tensor, num_nodes: int, num_ranks: int, *,
                    source_rank: Optional[torch.Tensor] = None, slot: bool = True,
                    token_in_rank: bool = True, pair_counts: bool = False) -> DispatchLayout:
    """Dispatch layout of exec_rank [T, K] int32 on the GPU, equal to ``cobalt.dispatch_layout``.
    pair_counts needs source_rank [T] int32."""
    _require(exec_rank, "exec_rank", torch.int32, (None, None))
    device = exec_rank.device
    num_tokens, top_k = int(exec_rank.shape[0]), int(exec_rank.shape[1])
    if pair_counts and source_rank is None:
        raise ValueError("cobalt.cuda.dispatch_layout: pair_counts needs source_rank")
    if source_rank is not None:
        _require(source_rank, "source_rank", torch.int32, (num_tokens,), device)

    def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    out = DispatchLayout(
        rank_counts=alloc((num_ranks,), torch.int64), node_counts=alloc((num_nodes,), torch.int64),
        rank_offsets=alloc((num_ranks + 1,), torch.int64),
        slot=alloc((num_tokens, top_k), torch.int32) if slot else None,
        token_in_rank=alloc((num_tokens, num_ranks), torch.uint8) if token_in_rank else None,
        pair_counts=alloc((num_ranks, num_ranks), torch.int64) if pair_counts else None)
    m = _module()
    ws_bytes = m.dispatch_layout_workspace_bytes(num_tokens, num_ranks)
    ws, ws_ptr = _workspace(ws_bytes, device)
    with torch.cuda.device(device):
        m.dispatch_layout(_ptr(exec_rank), _ptr(source_rank), num_tokens, top_k, num_nodes,
                          num_ranks, _ptr(out.rank_counts), _ptr(out.node_counts),
                          _ptr(out.rank_offsets), _ptr(out.slot), _ptr(out.token_in_rank),
                          _ptr(out.pair_counts), ws_ptr, ws_bytes, _stream(device))
    del ws
    return out


# TopoEP status bits (include/cobalt/cuda/topoep.hpp).
_TOPOEP_STATUS = {1: "negative demand", 2: "more refinement moves on a node than "
                  "max_moves_per_node", 4: "more quotas than the capacity", 8: "internal error"}


@dataclass
class TopoEpPlan:
    """TopoEP's plan on the GPU (the quota arrays hold ``capacity`` rows; the first
    ``source_offsets[G]`` are the plan's, grouped by source rank). Read :meth:`check` (or
    ``status``) before using it: value errors found on the device are reported there."""

    slots: torch.Tensor  # [G, S] int32, -1 empty
    source_offsets: torch.Tensor  # [G + 1] int64
    quota_expert: torch.Tensor  # [capacity] int32
    quota_dst: torch.Tensor  # [capacity] int32
    quota_count: torch.Tensor  # [capacity] int64
    rank_loads: torch.Tensor  # [G] int64
    stats: torch.Tensor  # [4] int64: inter-node, intra-node, moves, dropped
    status: torch.Tensor  # [1] int32, 0 = valid

    def check(self) -> "TopoEpPlan":
        """Synchronises, raises ValueError/RuntimeError for a non-zero status, returns self."""
        code = int(self.status.item())
        if code:
            what = "; ".join(msg for bit, msg in _TOPOEP_STATUS.items() if code & bit)
            exc = ValueError if code == 1 else RuntimeError
            raise exc(f"cobalt.cuda.solve_topoep: {what} (status {code})")
        return self


def solve_topoep(demand: torch.Tensor, num_nodes: int, slots_per_rank: int, *,
                 token_bytes: float, expert_param_bytes: float,
                 max_moves_per_node: int = 4096) -> TopoEpPlan:
    """TopoEP's per-microbatch plan for demand Omega [G, E] int64 on the GPU, equal to
    ``cobalt.solve_topoep`` (no host synchronisation: call :meth:`TopoEpPlan.check`)."""
    _require(demand, "demand", torch.int64, (None, None))
    device = demand.device
    num_ranks, num_experts = int(demand.shape[0]), int(demand.shape[1])
    m = _module()
    capacity = int(m.topoep_quota_capacity(num_ranks, slots_per_rank))
    quotas = torch.empty((capacity, 4), dtype=torch.int32, device=device)  # {expert, dst, count}

    def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    plan = TopoEpPlan(slots=alloc((num_ranks, slots_per_rank), torch.int32),
                      source_offsets=alloc((num_ranks + 1,), torch.int64),
                      quota_expert=quotas[:, 0], quota_dst=quotas[:, 1],
                      quota_count=quotas.view(torch.int64)[:, 1],
                      rank_loads=alloc((num_ranks,), torch.int64), stats=alloc((4,), torch.int64),
                      status=alloc((1,), torch.int32))
    ws_bytes = m.topoep_workspace_bytes(num_nodes, num_ranks, num_experts, slots_per_rank,
                                        max_moves_per_node)
    ws, ws_ptr = _workspace(ws_bytes, device)
    with torch.cuda.device(device):
        m.solve_topoep(num_nodes, num_ranks, num_experts, slots_per_rank, float(token_bytes),
                       float(expert_param_bytes), _ptr(demand), max_moves_per_node,
                       _ptr(plan.slots), _ptr(plan.source_offsets), _ptr(quotas), capacity,
                       _ptr(plan.rank_loads), _ptr(plan.stats), _ptr(plan.status), ws_ptr,
                       ws_bytes, _stream(device))
    del ws
    return plan
