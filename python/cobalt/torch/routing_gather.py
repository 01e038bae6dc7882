"""Gathering one layer's routing from every rank, with input checks that fail on every rank
together (so a bad router on one rank raises a clear error everywhere instead of hanging)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from cobalt.torch.ep_group import EPGroup
from cobalt.torch.traffic import TrafficStats

__all__ = ["GatheredRouting", "agree_on_errors", "check_input", "gather_routing"]


class GatheredRouting:
    """Routing of all ranks: topk_ids [T, K] int32, source_rank [T] int32, token_offsets [G+1];
    any_requires_grad: whether any rank's layer input or gate weights require grad (so every
    rank can keep the same exchanges in its backward graph); placement_digests [G]: each rank's
    digest of its expert store's main placement (all equal when the ranks agree)."""

    def __init__(self, topk_ids: np.ndarray, source_rank: np.ndarray,
                 token_offsets: np.ndarray, any_requires_grad: bool,
                 placement_digests: Optional[np.ndarray] = None) -> None:
        self.topk_ids = topk_ids
        self.source_rank = source_rank
        self.token_offsets = token_offsets
        self.any_requires_grad = any_requires_grad
        # [G] int64: each rank's `placement_digest` (gather_routing), equal when ranks agree.
        self.placement_digests = (np.zeros(1, dtype=np.int64) if placement_digests is None
                                  else placement_digests)


def agree_on_errors(ep: EPGroup, local_error: Optional[str], context: str) -> None:
    """A collective: raises ValueError on every rank when any rank reports an error, listing
    each failing rank's message (ranks with the same message together)."""
    flag = torch.tensor([0 if local_error is None else 1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ep.group)
    if flag.item() == 0:
        return
    messages: list[Optional[str]] = [None] * ep.world_size
    dist.all_gather_object(messages, local_error, group=ep.group)
    by_message: dict[str, list[int]] = {}
    for r, m in enumerate(messages):
        if m is not None:
            by_message.setdefault(m, []).append(r)
    lines = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {m}"
             for m, ranks in by_message.items()]
    raise ValueError(f"{context}: " + "; ".join(lines))


_CPU_ONLY = "the expert-parallel runtime runs CPU tensors only (gloo); move it with .cpu()"


def _check_local(ids: torch.Tensor, gates: torch.Tensor, x: torch.Tensor, hidden: int,
                 num_experts: int, top_k: int) -> Optional[str]:
    if x.dim() != 2 or x.shape[1] != hidden:
        return f"input has shape {tuple(x.shape)}, expected [tokens, {hidden}]"
    for name, t in (("topk_ids", ids), ("weights", gates)):
        if t.device.type != "cpu":
            return f"router returned {name} on device {t.device}; {_CPU_ONLY}"
    if ids.dim() != 2 or ids.shape != (x.shape[0], top_k):
        return f"router returned topk_ids of shape {tuple(ids.shape)}, expected [{x.shape[0]}, {top_k}]"
    if gates.shape != ids.shape:
        return f"router returned weights of shape {tuple(gates.shape)}, expected {tuple(ids.shape)}"
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        return f"router returned topk_ids of dtype {ids.dtype}, expected an integer dtype"
    a = ids.detach().to(torch.int64).numpy()
    bad = np.argwhere((a < 0) | (a >= num_experts))
    if bad.shape[0]:
        t, k = (int(v) for v in bad[0])
        return (f"router returned expert id {int(a[t, k])} for token {t} (position {k}), "
                f"valid range [0, {num_experts})")
    if top_k > 1 and a.shape[0]:
        srt = np.sort(a, axis=1)
        dup = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))
        if dup.shape[0]:
            t = int(dup[0])
            return f"router returned duplicate expert ids {a[t].tolist()} for token {t}"
    if not gates.dtype.is_floating_point:
        return f"router returned weights of dtype {gates.dtype}, expected a floating dtype"
    if not torch.isfinite(gates.detach()).all():
        return "router returned non-finite weights"
    return None


def check_input(x: torch.Tensor, hidden: int, dtype: Optional[torch.dtype] = None,
                bank_device: Optional[torch.device] = None) -> Optional[str]:
    """The layer input's problem, if any (before the router sees it): a CPU tensor (and, when
    `bank_device` is given, an expert bank on the CPU), shape [tokens, hidden], and when `dtype`
    is given (the expert bank's), that floating dtype."""
    if bank_device is not None and bank_device.type != "cpu":
        return f"expert bank is on device {bank_device}; {_CPU_ONLY}"
    if x.device.type != "cpu":
        return f"input is on device {x.device}; {_CPU_ONLY}"
    if x.dim() != 2 or x.shape[1] != hidden:
        return f"input has shape {tuple(x.shape)}, expected [tokens, {hidden}]"
    if dtype is not None and x.dtype != dtype:
        return (f"input has dtype {x.dtype}, the expert bank {dtype} (convert the input or the "
                f"layer with .to(dtype))")
    if dtype is not None and dtype.is_floating_point and not _cpu_computes(dtype):
        return (f"expert bank dtype {dtype} has no CPU matmul in this torch {torch.__version__}; "
                "use torch.bfloat16, torch.float32 or torch.float64")
    return None


_CPU_DTYPE_OK: dict[torch.dtype, bool] = {}


def _cpu_computes(dtype: torch.dtype) -> bool:
    """Whether this torch has the CPU kernels the expert FFN needs (matmul and SiLU) for `dtype`
    (float16 has none in torch 1.13): the ranks with tasks would raise in the expert compute
    while the ranks without any wait in the combine exchange."""
    if dtype not in _CPU_DTYPE_OK:
        try:
            a = torch.ones(2, 2, dtype=dtype)
            torch.nn.functional.silu(a @ a)
            _CPU_DTYPE_OK[dtype] = True
        except RuntimeError:
            _CPU_DTYPE_OK[dtype] = False
    return _CPU_DTYPE_OK[dtype]


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _agree_on_settings(counts: list[torch.Tensor], context: str) -> None:
    """Raises ValueError (on every rank: each sees the same gathered values) when the ranks'
    layers disagree on top-k, hidden size, number of experts, input dtype, gradient mode,
    whether the expert bank is trainable or the dense gradients they sum per backward pass."""
    names = ("top_k", "hidden size", "number of experts", "input dtype",
             "gradient mode (1: enabled; torch.no_grad() on some ranks only?)",
             "expert bank's requires_grad (1: trainable; experts frozen on some ranks only?)",
             "dense gradient elements summed per backward pass (trainable router parameters "
             "with sync_dense_grads, 0: none; router frozen or sync_dense_grads off on some "
             "ranks only?)")
    for field, name in enumerate(names):
        values = [int(c[3 + field].item()) for c in counts]
        if len(set(values)) == 1:
            continue
        by_value: dict[int, list[int]] = {}
        for r, v in enumerate(values):
            by_value.setdefault(v, []).append(r)

        def shown(v: int) -> str:
            if field != 3:
                return str(v)
            return str(_DTYPES[v]).replace("torch.", "") if v < len(_DTYPES) else "another dtype"
        parts = [f"{shown(v)} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                 for v, rs in by_value.items()]
        rule = ("every rank must build the same layer" if field < 4 else
                "every rank must run the layer alike")
        raise ValueError(f"{context}: the ranks' layers disagree on the {name}: "
                         f"{'; '.join(parts)} ({rule})")


def gather_routing(ep: EPGroup, x: torch.Tensor, ids: Optional[torch.Tensor],
                   gates: Optional[torch.Tensor], *, hidden: int, num_experts: int, top_k: int,
                   context: str, local_error: Optional[str] = None,
                   traffic: Optional[TrafficStats] = None,
                   placement_digest: int = 0, bank_trainable: bool = False,
                   dense_sync_numel: int = 0) -> GatheredRouting:
    """Checks every rank's router output (agreeing on errors), then all-gathers the expert ids.

    x [T_r, hidden], ids [T_r, K] integer, gates [T_r, K]; `local_error` reports a problem found
    earlier on this rank (e.g. the router raised; ids and gates may then be None);
    `placement_digest` (an int64) travels with the token counts, so the caller can check at no
    extra collective that every rank holds the same expert placement. The layer's settings
    (top-k, hidden size, number of experts, input dtype), the gradient mode, whether the
    expert bank is trainable (`bank_trainable`) and the elements of the dense gradients summed
    at the end of each backward pass (`dense_sync_numel`) travel with them too: they decide the
    sizes of the exchanges and which of them take part in the backward pass, so ranks that
    disagree on them raise here instead of aborting or hanging in an exchange. Raises
    ValueError on every rank, naming the offending rank(s), token and value, when any rank's
    input is malformed.
    """
    if local_error is None:
        if ids is None or gates is None:
            local_error = "router returned no ids/weights"
        elif not isinstance(ids, torch.Tensor) or not isinstance(gates, torch.Tensor):
            local_error = (f"router returned ({type(ids).__name__}, {type(gates).__name__}), "
                           "expected (topk_ids, weights) tensors")
        else:
            try:
                local_error = _check_local(ids, gates, x, hidden, num_experts, top_k)
            except Exception as exc:  # noqa: BLE001 - reported on every rank, not hung on
                local_error = f"checking the router output raised {type(exc).__name__}: {exc}"
    agree_on_errors(ep, local_error, context)
    assert ids is not None
    g = ep.world_size
    assert gates is not None
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or gates.requires_grad)
    # The layer's settings travel with the counts: ranks that disagree on them would exchange
    # buffers of different sizes, which gloo answers by aborting every process.
    settings = (top_k, hidden, num_experts, _dtype_code(x.dtype), int(torch.is_grad_enabled()),
                int(bank_trainable),
                int(dense_sync_numel) if torch.is_grad_enabled() else 0)  # no sync without grad
    count = torch.tensor([x.shape[0], int(wants_grad), placement_digest, *settings],
                         dtype=torch.int64)
    counts = [torch.zeros(count.numel(), dtype=torch.int64) for _ in range(g)]
    dist.all_gather(counts, count, group=ep.group)
    _agree_on_settings(counts, context)
    sizes = np.array([int(c[0].item()) for c in counts], dtype=np.int64)
    any_requires_grad = any(int(c[1].item()) for c in counts)
    # At least one (padding) row: gloo fails on empty all_gather when no rank has tokens.
    longest = max(1, int(sizes.max(initial=0)))
    padded = torch.full((longest, top_k), -1, dtype=torch.int32)
    padded[: x.shape[0]] = ids.detach().to(torch.int32)
    parts = [torch.empty_like(padded) for _ in range(g)]
    dist.all_gather(parts, padded, group=ep.group)
    if traffic is not None:
        traffic.record("routing.fwd", [0 if r == ep.rank else longest for r in range(g)],
                       top_k * 4)
    topk_ids = np.concatenate([p[: sizes[r]].numpy() for r, p in enumerate(parts)], axis=0)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    source = np.repeat(np.arange(g, dtype=np.int32), sizes)
    digests = np.array([int(c[2].item()) for c in counts], dtype=np.int64)
    return GatheredRouting(np.ascontiguousarray(topk_ids, dtype=np.int32), source, offsets,
                           any_requires_grad, digests)
