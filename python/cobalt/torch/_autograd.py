"""Autograd-engine queries shared by the expert-parallel layer and the routing recorder."""

from __future__ import annotations

import torch

__all__ = ["in_backward_pass"]


def in_backward_pass() -> bool:
    """True while the autograd engine runs a backward pass on this thread (a forward called then
    is an activation-checkpoint recomputation, reentrant or not)."""
    graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # torch >= 2.0
    if graph_task_id is not None:
        return bool(graph_task_id() != -1)
    # torch 1.13: this query is refused outside a backward pass.
    with torch.enable_grad():
        probe = (torch.zeros((), requires_grad=True) * 1).grad_fn
    try:
        torch._C._will_engine_execute_node(probe)
    except (RuntimeError, TypeError):
        return False
    return True
