"""Cobalt: expert replica placement and task assignment for expert-parallel MoE training.

The C++ core is in :mod:`cobalt._core` (re-exported here); :mod:`cobalt.torch` holds the PyTorch
integration (routing recorder, expert-parallel MoE layer and runtime).
"""

from cobalt._core import *  # noqa: F401,F403
from cobalt._core import (  # noqa: F401  (explicit names for type checkers)
    CrossNodeTransfers,
    ExpertLayout,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    IoError,
    IoFileNotFoundError,
    IoPermissionError,
    Policy,
    PolicyConfig,
    RoutingBatch,
    RoutingStats,
    Topology,
    TraceData,
    TraceReader,
    assign_balanced_cover,
    assign_node_cover,
    cross_node_transfers,
    make_policy,
    policy_names,
    write_trace,
)

__version__ = "0.1.0"
