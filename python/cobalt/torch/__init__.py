"""PyTorch integration of Cobalt.

* :class:`RoutingRecorder` records a model's routing (top-k expert ids per token) into
  cobalt-trace v1 files.
* :class:`ExpertParallelMoE` / :class:`ExpertParallelRuntime`: an MoE layer whose experts are
  distributed over a torch.distributed group of G ranks in N (real or simulated) nodes, executing
  layouts and task assignments from the C++ core, with node-deduplicated dispatch/combine, replica
  gradient reduction into main instances, and versioned all-or-nothing layout changes (CPU
  tensors over gloo); :func:`check_checkpoint` checks a checkpoint's expert placement before
  anything is loaded.
* :class:`ReferenceMoE`: the same layer in one process (ground truth for tests).
* :mod:`cobalt.torch.ops`: the per-step operations (task assignment, routing counts, dispatch
  layout, TopoEP's solver) on torch tensors, run by the CUDA kernels for CUDA tensors and by the
  CPU references otherwise.
"""

from cobalt.torch import ops
from cobalt.torch.ddp import ddp_ignored_parameter_names, wrap_ddp
from cobalt.torch.ep_group import EPGroup
from cobalt.torch.exchange_plan import ExchangePlan, RoutingGlobal, build_exchange_plan
from cobalt.torch.expert_store import ExpertStore, MigrationCounters, check_checkpoint
from cobalt.torch.experts import ReferenceMoE, TopKRouter, expert_init, router_init, swiglu
from cobalt.torch.launch import free_port, init_gloo, launch
from cobalt.torch.layout_source import (
    FixedLayoutSource,
    LayoutSource,
    PolicyLayoutSource,
    ScheduledLayoutSource,
    routing_token_offset,
)
from cobalt.torch.dense_grads import allreduce_gradients
from cobalt.torch.moe import ExpertParallelMoE
from cobalt.torch.recorder import RoutingRecorder
from cobalt.torch.reshard import gather_training_state, load_training_state
from cobalt.torch.runtime import ExpertParallelRuntime, StepRecord
from cobalt.torch.traffic import Traffic, TrafficStats

__all__ = [
    "ops",
    "EPGroup",
    "ExchangePlan",
    "ExpertParallelMoE",
    "ExpertParallelRuntime",
    "ExpertStore",
    "FixedLayoutSource",
    "LayoutSource",
    "MigrationCounters",
    "PolicyLayoutSource",
    "ReferenceMoE",
    "RoutingGlobal",
    "RoutingRecorder",
    "ScheduledLayoutSource",
    "StepRecord",
    "TopKRouter",
    "Traffic",
    "TrafficStats",
    "allreduce_gradients",
    "build_exchange_plan",
    "check_checkpoint",
    "ddp_ignored_parameter_names",
    "expert_init",
    "free_port",
    "gather_training_state",
    "init_gloo",
    "launch",
    "load_training_state",
    "router_init",
    "routing_token_offset",
    "swiglu",
    "wrap_ddp",
]
