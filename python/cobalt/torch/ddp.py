"""DistributedDataParallel around a model with :class:`~cobalt.torch.ExpertParallelMoE` layers.

Plain ``DistributedDataParallel(model)`` is wrong for such a model in two ways, silently:

* when built, it broadcasts rank 0's parameters to every rank, overwriting each rank's own expert
  bank (every rank holds different experts), and it would then average the bank's gradients over
  ranks that hold different experts;
* it averages gradients over the ranks, while the runtime's gradients are those of the sum of all
  ranks' losses (the README's loop divides the loss by the world size and sums dense gradients
  with :func:`~cobalt.torch.allreduce_gradients`), so the replicated weights' gradients would be
  ``world_size`` times too small, and a router summed by its layer (``sync_dense_grads``) would
  be reduced twice.

:func:`wrap_ddp` builds DDP with the layers' own parameters left out (expert banks always,
routers when their layer sums them) and a communication hook that sums instead of averaging, so
the gradients are those of the README's loop. An ``ExpertParallelMoE`` run inside a DDP forward
that covers its parameters raises ValueError on every rank (:func:`check_ddp`).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["wrap_ddp", "ddp_ignored_parameter_names"]


def _owned_parameters(moe: nn.Module) -> list[nn.Parameter]:
    """The parameters an ExpertParallelMoE reduces itself (or must never be reduced)."""
    owned = list(moe.expert_parameters())
    if moe.sync_dense_grads:
        owned += moe.dense_parameters()
    return owned


def ddp_ignored_parameter_names(model: nn.Module) -> list[str]:
    """Fully qualified names (as ``model.named_parameters()`` gives them) of the parameters DDP
    must leave alone: every ExpertParallelMoE's expert bank, and its router's parameters when the
    layer sums them itself (``sync_dense_grads``)."""
    from cobalt.torch.moe import ExpertParallelMoE

    owned: set[int] = set()
    for module in model.modules():
        if isinstance(module, ExpertParallelMoE):
            owned.update(id(p) for p in _owned_parameters(module))
    return [name for name, p in model.named_parameters() if id(p) in owned]


def _sum_hook(group, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: the bucket's gradients summed over `group` (DDP's own averages).
    No annotations: DDP compares them with dist.GradBucket, and this module's are strings."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap_ddp(model: nn.Module, group: Optional[dist.ProcessGroup] = None,
             **ddp_kwargs: Any) -> DistributedDataParallel:
    """``DistributedDataParallel(model, process_group=group, **ddp_kwargs)`` for a model with
    ExpertParallelMoE layers: their expert banks (and routers they sum themselves) are left out
    (:func:`ddp_ignored_parameter_names`), and gradients are summed over the group, not averaged,
    so the loop stays the README's: backward of ``loss / world_size`` gives every parameter the
    gradient of the mean loss over all ranks' tokens, with no :func:`allreduce_gradients` call.
    Call it before any forward. Gradients in a dtype the backend cannot reduce (bfloat16 on gloo)
    fail in DDP's own reduction; reduce such parameters with :func:`allreduce_gradients`."""
    if "process_group" in ddp_kwargs:
        raise ValueError("wrap_ddp: pass the process group as `group`, not process_group=")
    already = list(getattr(model, "_ddp_params_and_buffers_to_ignore", []))  # the caller's
    names = already + [n for n in ddp_ignored_parameter_names(model) if n not in already]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    ddp = DistributedDataParallel(model, process_group=group, **ddp_kwargs)
    ddp.register_comm_hook(group, _sum_hook)
    return ddp


def check_ddp(moe: nn.Module) -> None:
    """Raises ValueError when `moe` runs inside a DistributedDataParallel forward whose reduction
    covers parameters the layer owns (plain ``DistributedDataParallel(model)``): DDP then already
    overwrote this rank's experts with rank 0's when it was built. The same on every rank (every
    rank wraps its model alike), so no rank is left waiting in a collective."""
    active = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    ddp = active() if active is not None else None
    checked = moe.__dict__.get("_ddp_checked")
    if ddp is None or (checked is not None and checked() is ddp):
        return
    ignored = set(getattr(ddp, "parameters_to_ignore", ()))
    names = {id(p): name for name, p in ddp.module.named_parameters()}
    covered = [names[id(p)] for p in _owned_parameters(moe)
               if id(p) in names and names[id(p)] not in ignored]
    if covered:
        shown = ", ".join(covered[:3]) + (f", ... ({len(covered)} in all)" if len(covered) > 3
                                          else "")
        raise ValueError(
            f"ExpertParallelMoE layer {moe.layer} runs inside DistributedDataParallel, which "
            f"reduces its parameters ({shown}): DDP broadcast rank 0's parameters over every "
            "rank's own experts when it was built, and averages gradients the layer sums itself. "
            "Build the model again and wrap it with cobalt.torch.wrap_ddp(model, group)")
    # Checked once per DDP module. Kept out of nn.Module.__setattr__, which would register the
    # DDP module as a child of the layer (a cycle: ddp -> model -> layer -> ddp).
    moe.__dict__["_ddp_checked"] = weakref.ref(ddp)
