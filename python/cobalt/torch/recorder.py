"""RoutingRecorder: record a model's routing into cobalt-trace v1 files (DESIGN.md 3.1), which
``cobalt trace info`` and ``cobalt simulate --trace`` read.

Attach it to the router module of each MoE layer (a forward hook); it extracts the top-k expert
ids [T, K] of every forward. Call :meth:`RoutingRecorder.end_step` once per training step: that
closes the step (with a process group it also gathers every rank's tokens, tagging each with its
source rank). :meth:`RoutingRecorder.write` writes the trace through the C++ writer, which
validates it first.

Every recorded layer must see the same tokens in a step (the format stores [L, T, K] for the same
T tokens at each layer), as in a transformer where every token passes every MoE layer.

Router forwards that run while the autograd engine runs a backward pass are not recorded: they
are activation-checkpoint recomputations (``torch.utils.checkpoint``, reentrant or not) of
forwards recorded already.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import cobalt
from cobalt.torch._autograd import in_backward_pass
from cobalt.torch.ep_group import EPGroup
from cobalt.torch.routing_gather import agree_on_errors

__all__ = ["RoutingRecorder", "default_extract"]

Extract = Callable[[nn.Module, tuple[Any, ...], Any], Union[torch.Tensor, np.ndarray]]


def default_extract(top_k: int) -> Extract:
    """Top-k ids from a router's output: the first 2-d integer tensor of a tuple/list output
    (e.g. (topk_ids, topk_weights)), or top-k over the last dimension of a float output
    (logits or probabilities [..., E])."""

    def extract(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> torch.Tensor:
        if isinstance(output, (tuple, list)):
            for item in output:
                if torch.is_tensor(item) and not item.dtype.is_floating_point and item.dim() == 2:
                    return item
            raise ValueError("RoutingRecorder: the router output has no 2-d integer tensor of "
                             "top-k ids; pass extract=")
        if torch.is_tensor(output) and output.dtype.is_floating_point:
            return output.detach().topk(top_k, dim=-1).indices.reshape(-1, top_k)
        raise ValueError(f"RoutingRecorder: cannot find top-k ids in a router output of type "
                         f"{type(output).__name__}; pass extract=")

    return extract


class RoutingRecorder:
    """Records top-k expert ids from router modules, step by step.

    Args:
        num_experts, top_k: E and K of the routers.
        extract: (module, inputs, output) -> ids [T, K]; default :func:`default_extract`.
        ep: with an :class:`EPGroup`, :meth:`end_step` gathers all ranks' tokens (a collective;
            call it on every rank) and records each token's source rank (num_sources = G).
        source_rank: without `ep`, the source rank of every recorded token (None: not recorded).
        num_sources: without `ep`, the metadata num_sources (0: max source + 1).
        metadata: extra string metadata (model, dataset, notes, ...).
    """

    def __init__(self, num_experts: int, top_k: int, *, extract: Optional[Extract] = None,
                 ep: Optional[EPGroup] = None, source_rank: Optional[int] = None,
                 num_sources: int = 0, metadata: Optional[dict[str, str]] = None) -> None:
        if not 1 <= num_experts <= 65536:
            raise ValueError(f"RoutingRecorder: num_experts {num_experts} out of range "
                             "[1, 65536]")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"RoutingRecorder: top_k {top_k} out of range [1, {num_experts}]")
        if source_rank is not None and source_rank < 0:
            raise ValueError(f"RoutingRecorder: source_rank {source_rank} must be >= 0")
        reserved = {"top_k", "num_experts"} & set(metadata or {})
        if reserved:
            raise ValueError(f"RoutingRecorder: metadata keys {sorted(reserved)} are reserved "
                             "(the recorder writes them)")
        self.num_experts = num_experts
        self.top_k = top_k
        self.extract = extract if extract is not None else default_extract(top_k)
        self.ep = ep
        self.source_rank = source_rank
        self.num_sources = ep.world_size if ep is not None else num_sources
        self.metadata = {"origin": "cobalt.torch.RoutingRecorder", **(metadata or {})}
        self._handles: dict[int, torch.utils.hooks.RemovableHandle] = {}
        self._current: dict[int, list[np.ndarray]] = {}
        self._error: Optional[str] = None
        self._steps: list[np.ndarray] = []  # per step: [L, T_s, K] int32
        self._sources: list[np.ndarray] = []  # per step: [T_s] int32 (when known)
        self.enabled = True

    # ------------------------------------------------------------------ hooks
    def attach(self, router: nn.Module, layer: int) -> None:
        """Records `router`'s output as MoE layer `layer` (layers must be 0..L-1); forwards run
        during a backward pass (checkpoint recomputations) are skipped."""
        if layer in self._handles:
            raise ValueError(f"RoutingRecorder: layer {layer} is already attached")
        if layer < 0:
            raise ValueError(f"RoutingRecorder: layer {layer} must be >= 0")

        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if self.enabled and not in_backward_pass():
                self._capture(layer, module, inputs, output)

        self._handles[layer] = router.register_forward_hook(hook)

    def detach(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    def _capture(self, layer: int, module: nn.Module, inputs: tuple[Any, ...], output: Any
                 ) -> None:
        try:
            ids = self.extract(module, inputs, output)
            a = (ids.detach().cpu().numpy() if torch.is_tensor(ids) else np.asarray(ids))
            if a.ndim != 2 or a.shape[1] != self.top_k:
                raise ValueError(f"layer {layer}: extracted ids of shape {a.shape}, expected "
                                 f"[T, {self.top_k}]")
            if a.dtype.kind not in "iu":  # a float or bool id would be truncated when stored
                raise ValueError(f"layer {layer}: extracted ids of dtype {a.dtype}, expected "
                                 "integers")
            bad = np.argwhere((a < 0) | (a >= self.num_experts))
            if bad.shape[0]:
                t, k = (int(v) for v in bad[0])
                raise ValueError(f"layer {layer}: expert id {int(a[t, k])} for token {t} out of "
                                 f"range [0, {self.num_experts})")
            if self.top_k > 1 and a.shape[0]:
                ordered = np.sort(a, axis=1)
                repeated = np.argwhere(ordered[:, 1:] == ordered[:, :-1])
                if repeated.shape[0]:
                    t = int(repeated[0][0])
                    raise ValueError(f"layer {layer}: token {t} selects expert "
                                     f"{int(ordered[t, repeated[0][1]])} twice (the top-k ids of "
                                     "a token must be distinct)")
            self._current.setdefault(layer, []).append(a.astype(np.int32))
        except Exception as exc:  # noqa: BLE001 - with a group: raised on every rank at end_step
            if self.ep is None:
                raise
            if self._error is None:
                self._error = str(exc) if isinstance(exc, ValueError) else \
                    f"{type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ steps
    def end_step(self) -> None:
        """Closes the current step. With `ep` a collective: errors captured on any rank raise a
        ValueError on every rank here."""
        error, self._error = self._error, None
        layers = sorted(self._current)
        if error is None and layers and layers != list(range(len(layers))):
            error = f"recorded layers {layers} are not 0..{len(layers) - 1}"
        step_ids = [np.concatenate(self._current[l], axis=0) for l in layers]
        if error is None and len({a.shape[0] for a in step_ids}) > 1:
            error = ("layers saw different token counts in one step: "
                     f"{[a.shape[0] for a in step_ids]}")
        if error is None and self._steps and step_ids and len(step_ids) != self._steps[0].shape[0]:
            error = f"step has {len(step_ids)} layers, earlier steps {self._steps[0].shape[0]}"
        self._current = {}
        if self.ep is not None:
            agree_on_errors(self.ep, error, "RoutingRecorder")
            self._gather_step(step_ids)
            return
        if error is not None:
            raise ValueError(f"RoutingRecorder: {error}")
        if not step_ids:
            return
        stacked = np.stack(step_ids)
        self._steps.append(stacked)
        if self.source_rank is not None:
            self._sources.append(np.full(stacked.shape[1], self.source_rank, dtype=np.int32))

    def _gather_step(self, step_ids: list[np.ndarray]) -> None:
        ep = self.ep
        assert ep is not None
        num_layers = torch.tensor([len(step_ids)], dtype=torch.int64)
        lo, hi = num_layers.clone(), num_layers.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=ep.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=ep.group)
        if lo.item() != hi.item():
            raise ValueError(f"RoutingRecorder: ranks recorded different numbers of layers "
                             f"({lo.item()}..{hi.item()}) in one step")
        num_l = int(lo.item())
        if num_l == 0:
            return
        local = np.stack(step_ids)  # [L, T_r, K]
        count = torch.tensor([local.shape[1]], dtype=torch.int64)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(ep.world_size)]
        dist.all_gather(counts, count, group=ep.group)
        sizes = [int(c.item()) for c in counts]
        longest = max(1, max(sizes))  # gloo fails on empty all_gather when no rank has tokens
        padded = torch.full((num_l, longest, self.top_k), -1, dtype=torch.int32)
        padded[:, : local.shape[1]] = torch.from_numpy(local)
        parts = [torch.empty_like(padded) for _ in range(ep.world_size)]
        dist.all_gather(parts, padded, group=ep.group)
        self._steps.append(np.concatenate([p[:, :n].numpy() for p, n in zip(parts, sizes)],
                                          axis=1))
        self._sources.append(np.repeat(np.arange(ep.world_size, dtype=np.int32), sizes))

    # ------------------------------------------------------------------ output
    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def trace_data(self) -> cobalt.TraceData:
        """Everything recorded so far as a cobalt.TraceData (topk_ids [L, T, K])."""
        if not self._steps:
            raise ValueError("RoutingRecorder: nothing recorded (call end_step after forwards)")
        topk = np.ascontiguousarray(np.concatenate(self._steps, axis=1), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum([s.shape[1] for s in self._steps])])
        sources = (np.concatenate(self._sources).astype(np.int32)
                   if len(self._sources) == len(self._steps) else None)
        return cobalt.TraceData(self.num_experts, topk_ids=topk,
                                step_offsets=offsets.astype(np.int64), source_rank=sources,
                                num_sources=self.num_sources if sources is not None else 0,
                                metadata=dict(self.metadata))

    def write(self, path: str, *, writer_rank: int = 0) -> bool:
        """Writes cobalt-trace v1 to `path` (with `ep`: only on `writer_rank`; every rank holds the
        same data). Returns True where written."""
        if self.ep is not None and self.ep.rank != writer_rank:
            return False
        cobalt.write_trace(path, self.trace_data())
        return True
