"""Gradients of the replicated (data-parallel) parameters, such as routers, summed over the
expert-parallel group: once per backward pass by the layer (:class:`DenseGradSync`), or by the
training loop after its passes (:func:`allreduce_gradients`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from cobalt.torch.reduce import all_reduce_sum_

__all__ = ["DenseGradSync", "allreduce_gradients"]


class DenseGradSync:
    """Sums the data-parallel (router) gradients over the group once per backward pass, counting
    every pass once. A hook on each parameter records, before autograd adds this rank's gradient
    of the pass, the gradient held so far (identical on every rank: zero, or the result of
    earlier syncs) and the pass's local gradient; at the end of the pass ``.grad`` becomes
    held-so-far + the all-reduced pass gradients, bitwise the same on every rank. So a second
    backward through a retained graph, or gradient accumulation over several passes, sums
    correctly (all-reducing ``.grad`` itself would count an earlier pass's already-summed
    gradient again).

    Every backward pass that reaches a tracked parameter ends with a sync: a pass through the
    layer's output queues it with the replica-gradient return (:meth:`mark_queued`, before the
    router's hooks run in that pass); a pass that reaches the router without passing the layer's
    output (an auxiliary router loss backpropagated on its own, say) queues it from the first
    parameter hook. Either way the sync is a collective: every rank must run the same backward
    passes (as with DDP)."""

    def __init__(self, group: Optional[dist.ProcessGroup]) -> None:
        self.group = group
        self.params: list[nn.Parameter] = []
        self.handles: list[Any] = []
        self.pass_grads: list[Optional[torch.Tensor]] = []
        self.held: list[Optional[torch.Tensor]] = []
        self.queued = False  # a sync is queued to run at the end of the current backward pass

    def track(self, params: list[nn.Parameter]) -> None:
        if [id(p) for p in params] == [id(p) for p in self.params]:
            return
        for h in self.handles:
            h.remove()
        self.params = list(params)
        self._reset()
        self.handles = [p.register_hook(self._recorder(i)) for i, p in enumerate(params)]

    def _reset(self) -> None:
        self.pass_grads = [None] * len(self.params)
        self.held = [None] * len(self.params)

    def mark_queued(self) -> None:
        """A sync is queued for the end of the current backward pass (by the layer's output)."""
        self.queued = True

    def _recorder(self, i: int) -> Callable[[torch.Tensor], None]:
        def record(grad: torch.Tensor) -> None:
            g = grad.detach()
            p = self.params[i]
            if not self.queued:  # a pass that did not come through the layer's output
                self.queued = True
                Variable._execution_engine.queue_callback(self.sync)
            # Contributions not summed yet (a pass whose sync did not run, e.g. one that raised)
            # are carried into this sync, unless the gradient was reset since (zero_grad): then
            # they are gone from .grad too.
            if self.pass_grads[i] is not None and (
                    p.grad is None or not bool(torch.count_nonzero(p.grad))):
                self.pass_grads[i] = None
            if self.pass_grads[i] is None:
                self.held[i] = None if p.grad is None else p.grad.detach().clone()
                self.pass_grads[i] = g.clone()
            else:
                self.pass_grads[i] = self.pass_grads[i] + g
        return record

    def sync(self) -> None:
        """A collective: every rank calls it at the end of each backward pass."""
        self.queued = False
        if not self.params:
            return
        local = [g if g is not None else torch.zeros_like(p)
                 for p, g in zip(self.params, self.pass_grads)]
        flat = torch.cat([g.reshape(-1) for g in local])
        all_reduce_sum_(flat, self.group)
        offset = 0
        with torch.no_grad():
            for i, p in enumerate(self.params):
                n = p.numel()
                total = flat[offset:offset + n].view_as(p)
                # No local gradient in this pass: .grad still holds what it held before.
                held = self.held[i] if self.pass_grads[i] is not None else p.grad
                new = total.clone() if held is None else held + total
                if p.grad is None:
                    p.grad = new
                else:
                    p.grad.copy_(new)
                offset += n
        self._reset()


def allreduce_gradients(params: list[nn.Parameter], group: Optional[dist.ProcessGroup] = None
                        ) -> None:
    """Sums the gradients of data-parallel (replicated) parameters over `group`, in one flat
    all_reduce; parameters without a gradient contribute zeros, parameters that require no
    gradient are skipped (no ``.grad`` is created for them). A collective: every rank passes
    the same parameters in the same order, with the same requires_grad flags."""
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    all_reduce_sum_(flat, group)
    offset = 0
    for p in params:
        n = p.numel()
        chunk = flat[offset:offset + n].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n
