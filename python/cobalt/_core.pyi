"""Typed stubs of cobalt._core (the pybind11 bindings of the C++ core).

Array conventions: inputs accept anything numpy can view (numpy arrays, torch CPU tensors via
their __array__); they are shared without copying when already C-contiguous with the stated
dtype, else converted once. Outputs documented as views are read-only numpy arrays that keep
their owner alive (no copy); "live" views change when the owner is updated.
"""

from __future__ import annotations

import enum
from typing import Any, Optional, Sequence, overload

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]

EMPTY_SLOT: int
MAX_NODES: int

class InvalidArgumentError(ValueError): ...
class FailedPreconditionError(RuntimeError): ...
class InternalError(RuntimeError): ...
class IoError(InvalidArgumentError, OSError):
    """A failed file operation; errno is the system call's (None when none failed)."""
class IoFileNotFoundError(IoError, FileNotFoundError): ...
class IoPermissionError(IoError, PermissionError): ...

# ---------------------------------------------------------------- core
class LinkParams:
    nvlink_bytes_per_s: float
    ib_bytes_per_s_per_node: float
    def __init__(self, nvlink_bytes_per_s: float = 900e9,
                 ib_bytes_per_s_per_node: float = 400e9) -> None: ...

class Topology:
    def __init__(self, num_nodes: int, num_ranks: int, links: LinkParams = ...) -> None: ...
    @staticmethod
    def parse(spec: str, links: LinkParams = ...) -> Topology: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def ranks_per_node(self) -> int: ...
    @property
    def links(self) -> LinkParams: ...
    def node_of(self, rank: int) -> int: ...
    def first_rank_of(self, node: int) -> int: ...

def reload_environment() -> None: ...
def slots_for_rho(num_experts: int, num_ranks: int, rho: float) -> int: ...
def slots_for_extra(num_experts: int, num_ranks: int, extra_slots: int) -> int: ...

class ReplicaMove:
    @property
    def expert(self) -> int: ...
    @property
    def src_rank(self) -> int: ...
    @property
    def dst_rank(self) -> int: ...
    @property
    def cross_node(self) -> bool: ...

class LayoutDiff:
    @property
    def moves(self) -> list[ReplicaMove]: ...
    @property
    def num_intra_node(self) -> int: ...
    @property
    def num_cross_node(self) -> int: ...
    @property
    def num_removed(self) -> int: ...

class ExpertLayout:
    def __init__(self, topology: Topology, num_experts: int, slots: ArrayLike) -> None:
        """slots: [G, S] int32 expert id per rank slot (-1 empty)."""
    @staticmethod
    def from_rank_lists(topology: Topology, num_experts: int, slots_per_rank: int,
                        experts_of_rank: Sequence[Sequence[int]]) -> ExpertLayout: ...
    @staticmethod
    def static_ep(topology: Topology, num_experts: int, slots_per_rank: int) -> ExpertLayout: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def slots_per_rank(self) -> int: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def slots(self) -> I32:
        """[G, S] read-only view."""
    def slots_of(self, rank: int) -> I32: ...
    def ranks_of(self, expert: int, node: Optional[int] = None) -> I32: ...
    def num_replicas_of(self, expert: int) -> int: ...
    @property
    def node_masks(self) -> U64:
        """[E]: bit n set when node n holds the expert."""
    def holds(self, rank: int, expert: int) -> bool: ...
    def num_used_slots(self, rank: int) -> int: ...
    def to_json(self) -> str: ...

def diff(from_layout: ExpertLayout, to_layout: ExpertLayout) -> LayoutDiff: ...

class RoutingBatch:
    def __init__(self, topk_ids: ArrayLike, source_rank: Optional[ArrayLike], num_experts: int,
                 num_ranks: int) -> None:
        """topk_ids [T, K], source_rank [T] (None: contiguous blocks per rank): any integer
        dtype whose values fit int32 (others raise ValueError); the batch keeps read-only int32
        copies, validated (K distinct ids in [0, E) per row, sources in [0, G))."""
    @property
    def num_tokens(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def topk_ids(self) -> I32: ...
    @property
    def source_rank(self) -> I32: ...
    def __len__(self) -> int: ...

def validate_assignment(batch: RoutingBatch, layout: ExpertLayout, exec_rank: ArrayLike) -> None: ...
def contiguous_source_ranks(num_tokens: int, num_ranks: int) -> I32: ...

# ---------------------------------------------------------------- stats
def count_routing(batch: RoutingBatch, num_threads: int = 1) -> tuple[I64, I64]:
    """(expert_counts [E], coactivation [E, E])."""

class OchiaiSummary:
    @property
    def count_weighted(self) -> float: ...
    @property
    def top_partner(self) -> float: ...

class RoutingStats:
    def __init__(self, num_experts: int, decay: float, exact: bool = False) -> None: ...
    @staticmethod
    def exact_counts(num_experts: int) -> RoutingStats: ...
    def update(self, batch: RoutingBatch, num_threads: int = 1) -> None: ...
    def fold_into_last_update(self, batch: RoutingBatch, num_threads: int = 1) -> None:
        """Adds a micro-batch's counts to the last update's observation (its step's)."""
    def update_counts(self, expert_counts: ArrayLike, coactivation: ArrayLike) -> None: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_updates(self) -> int: ...
    @property
    def decay(self) -> float: ...
    @property
    def exact(self) -> bool: ...
    @property
    def expert_load(self) -> F64:
        """[E] live read-only view."""
    @property
    def coactivation(self) -> F64:
        """[E, E] live read-only view."""
    def ochiai(self, i: int, j: int) -> float: ...
    def ochiai_summary(self) -> OchiaiSummary: ...

def summarize_ochiai(expert_load: ArrayLike, coactivation: ArrayLike) -> OchiaiSummary: ...
def hot_set_churn(prev_load: ArrayLike, next_load: ArrayLike, hot_count: int) -> float: ...

class ReplicaLoads:
    def __init__(self, num_ranks: int, slots_per_rank: int, decay: float) -> None: ...
    def reset(self, expected_loads: ArrayLike) -> None: ...
    def update(self, replica_counts: ArrayLike) -> None: ...
    @property
    def loads(self) -> F64: ...

def replica_task_counts(batch: RoutingBatch, layout: ExpertLayout, exec_rank: ArrayLike) -> I64:
    """[G, S] tasks per replica slot."""

# ---------------------------------------------------------------- plan
class GlobalPlanInput:
    def __init__(self, topology: Topology, num_experts: int, slots_per_rank: int,
                 expert_load: ArrayLike, coactivation: ArrayLike, eps: float = 0.15,
                 source_demand: Optional[ArrayLike] = None, source_weight: float = 0.0) -> None: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def slots_per_rank(self) -> int: ...
    @property
    def eps(self) -> float: ...
    @property
    def expert_load(self) -> F64: ...
    @property
    def coactivation(self) -> F64: ...
    def total_load(self) -> float: ...
    def rank_load_cap(self) -> float: ...

class NodePlan:
    @property
    def num_experts(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def replicas(self) -> npt.NDArray[np.intc]:
        """[E, N] replica counts x_en."""
    @property
    def load_share(self) -> F64:
        """[E, N] expected loads u_en."""

class HeuristicResult:
    @property
    def plan(self) -> NodePlan: ...
    @property
    def objective(self) -> float: ...
    @property
    def best_restart(self) -> int: ...
    @property
    def within_cap(self) -> bool:
        """`plan` passes check_node_plan (False: no restart met the load cap)."""
    @property
    def restart_within_cap(self) -> list[bool]: ...
    @property
    def restart_objectives(self) -> list[float]: ...
    @property
    def restart_plans(self) -> list[NodePlan]: ...

def plan_global_heuristic(input: GlobalPlanInput, num_restarts: int = 4, seed: int = 0,
                          use_metis: bool = True,
                          max_local_search_passes: int = 50) -> HeuristicResult: ...
def pack_ranks(input: GlobalPlanInput, plan: NodePlan,
               previous: Optional[ExpertLayout] = None) -> tuple[ExpertLayout, F64]: ...
def node_plan_of(layout: ExpertLayout, expert_load: ArrayLike) -> NodePlan: ...
def coactivation_objective(input: GlobalPlanInput, plan: NodePlan) -> float: ...
def check_node_plan(input: GlobalPlanInput, plan: NodePlan) -> str: ...

class RebalanceResult:
    @property
    def layout(self) -> ExpertLayout: ...
    @property
    def slot_loads(self) -> F64: ...
    @property
    def num_moves(self) -> int: ...

def rebalance_intra_node(layout: ExpertLayout, slot_loads: ArrayLike,
                         min_gain: float = 0.01) -> RebalanceResult: ...

class FloorSwapResult:
    @property
    def layout(self) -> ExpertLayout: ...
    @property
    def swaps(self) -> list[tuple[int, int, int, int, int, int, int]]:
        """(rank, slot, removed expert or -1, added expert, floor once applied, exchange rank,
        exchange slot), in order; an exchange (exchange rank >= 0) moves `removed` into that slot, whose
        replica of `added` it replaces."""
    @property
    def floor_before(self) -> int: ...
    @property
    def floor_after(self) -> int: ...

def swap_toward_floor(layout: ExpertLayout, expert_counts: ArrayLike, removal_cost: ArrayLike,
                      tolerance: float = 0.05, max_swaps: int = 1,
                      max_checks: int = 64, max_exchange_checks: int = 256,
                      max_group_swaps: int = 0) -> FloorSwapResult:
    """cobalt+'s stage 2b: replica swaps lowering the balance floor (expert_counts [E] int64,
    removal_cost [N, E] float64: the price of taking e's last replica off node n). With
    max_group_swaps >= 2, where no single swap or exchange lowers the floor, groups of up to that
    many swaps that lower it together (a group's earlier swaps keep the floor)."""

# ---------------------------------------------------------------- assign
class CoverSearch(enum.Enum):
    MASK_ENUMERATION = ...
    SUBSET_DP = ...
    AUTO = ...

class CpuKernel(enum.Enum):
    AUTO = ...
    PORTABLE = ...
    AVX512 = ...

def avx512_kernel_available() -> bool: ...
def assign_node_cover(batch: RoutingBatch, layout: ExpertLayout, seed: int = 0, step: int = 0,
                      layer: int = 0, token_offset: int = 0,
                      search: CoverSearch = CoverSearch.AUTO, num_threads: int = 1,
                      out: Optional[I32] = None, kernel: CpuKernel = CpuKernel.AUTO) -> I32:
    """Cobalt Algorithm 1: exec_rank [T, K] int32 (the same ranks from every kernel). `out`, when
    given, is written into: a writeable C-contiguous int32 numpy array of T * K elements (e.g.
    tensor.numpy() of a CPU tensor); any other array or object is a TypeError."""

class BalancedCoverWorkspace:
    """Scratch memory of assign_balanced_cover(..., workspace=) kept across calls (a word per
    token and one per task, and the spill's per-replica bookkeeping, grown to the largest batch
    and layout seen); one call at a time."""
    def __init__(self) -> None: ...
    @property
    def capacity_bytes(self) -> int: ...

def assign_balanced_cover(batch: RoutingBatch, layout: ExpertLayout, spill_tolerance: float = -1.0,
                          search: CoverSearch = CoverSearch.AUTO, num_threads: int = 1,
                          out: Optional[np.ndarray] = None,
                          workspace: Optional[BalancedCoverWorkspace] = None, seed: int = 0,
                          step: int = 0, layer: int = 0, token_offset: int = 0) -> I32:
    """cobalt+'s balanced assignment: exec_rank [T, K] int32 (Algorithm 1's cross-node transfers;
    spill_tolerance >= 0 then trades copies for balance, cobalt+ uses 0.05), written into `out`
    when given (as assign_node_cover's); `workspace` keeps the scratch memory across calls (same
    ranks); seed, step, layer and token_offset key the draw between tied minimum covers, as in
    assign_node_cover."""
def min_remote_cover_size(experts: ArrayLike, src_node: int, layout: ExpertLayout) -> int: ...
class DispatchLayoutWorkspace:
    """Buffers for dispatch_layout(..., workspace=), sized once for batches of up to max_tokens
    tokens of up to max_top_k tasks on `topology`."""
    def __init__(self, topology: Topology, max_tokens: int, max_top_k: int) -> None: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def max_top_k(self) -> int: ...

def dispatch_layout(exec_rank: ArrayLike, source_rank: ArrayLike, topology: Topology,
                    workspace: Optional[DispatchLayoutWorkspace] = None) -> dict[str, np.ndarray]:
    """rank_counts [G], node_counts [N], rank_offsets [G + 1], pair_counts [G, G] (int64),
    token_in_rank [T, G] (uint8), slot [T, K] (int32). Fresh writable arrays, or with a workspace
    read-only views of its buffers that the next call with it overwrites."""
def exchange_plan(topk_ids: ArrayLike, exec_rank: ArrayLike, source_rank: ArrayLike,
                  topology: Topology, rank_slots: ArrayLike, rank: int) -> dict[str, Any]:
    """One rank's node-deduplicated dispatch/combine plan: int64 index arrays and per-peer
    splits as cobalt.torch.exchange_plan.ExchangePlan holds them (slot tasks as CSR:
    slot_offsets [S + 1], slot_rows, slot_k), num_local_tokens and whole-step counts
    (num_deliveries, num_cross_rows, num_intra_rows, num_stage1_rows)."""
def solve_topoep(demand: ArrayLike, topology: Topology, slots_per_rank: int, token_bytes: float,
                 expert_param_bytes: float) -> dict[str, np.ndarray]:
    """slots [G, S], source_offsets [G + 1], quota_expert / quota_dst / quota_count [Q],
    rank_loads [G], stats [4]."""

# ---------------------------------------------------------------- policy
class CostParams:
    """The simulator's cost model parameters (cobalt/eval/cost_model.hpp)."""
    nvlink_bytes_per_s: float
    ib_bytes_per_s_per_node: float
    achievable_flops: float
    hidden_size: int
    expert_ffn_size: int
    bytes_per_element: int
    matmuls_per_expert: int
    fwd_bwd_flops_factor: float
    exchanges_per_layer: int
    overlap_fraction: float
    grad_bytes_per_element: float
    param_refresh: bool
    optimizer_factor: float
    planner_time_scale: float
    planner_overlap: float
    def __init__(self) -> None: ...
    @staticmethod
    def from_presets(cluster: str = "4x8-b200", model: str = "glm-4.5-air") -> CostParams: ...
    @property
    def token_bytes(self) -> float: ...
    @property
    def expert_param_bytes(self) -> float: ...
    @property
    def flops_per_task(self) -> float: ...
    def validate(self) -> None: ...

class PolicyConfig:
    topology: Topology
    num_experts: int
    top_k: int
    num_layers: int
    slots_per_rank: int
    eps: float
    steps_per_global_plan: int
    ema_decay: float
    seed: int
    num_threads: int
    async_planning: bool
    planner_restarts: int
    token_bytes: float
    expert_param_bytes: float
    gemm_flops_per_s: float
    cost_model: Optional[CostParams]
    def __init__(self, topology: Topology, num_experts: int, top_k: int, num_layers: int = 1,
                 slots_per_rank: int = 0, eps: float = 0.15, steps_per_global_plan: int = 10,
                 ema_decay: float = 0.9, seed: int = 0, num_threads: int = 1,
                 async_planning: bool = False, planner_restarts: int = 8,
                 token_bytes: float = 8192.0, expert_param_bytes: float = 34603008.0,
                 cost_model: Optional[CostParams] = None,
                 gemm_flops_per_s: float = 4e14) -> None: ...
    def validate(self) -> None: ...

class PolicyCounters:
    @property
    def planner_wall_ms(self) -> float: ...
    @property
    def async_plan_ms(self) -> float: ...
    @property
    def num_global_plans(self) -> int: ...
    @property
    def intra_node_moves(self) -> int: ...
    @property
    def cross_node_moves(self) -> int: ...
    @property
    def max_solver_calls(self) -> int: ...

class Policy:
    @property
    def name(self) -> str: ...
    @property
    def needs_token_ids(self) -> bool: ...
    @property
    def config(self) -> PolicyConfig: ...
    def run(self, step: int, layer: int, batch: RoutingBatch) -> tuple[ExpertLayout, I32]:
        """(layout in force, exec_rank [T, K] int32). Steps start at 0 and must not decrease per
        layer (a step may repeat); InvalidArgumentError otherwise (Policy::run in
        include/cobalt/policy/policy.hpp)."""
    def run_loads(self, step: int, layer: int, counts: ArrayLike) -> tuple[ExpertLayout, I64]:
        """counts [G, E] -> (layout, rank_loads [G]); steps as for run()."""
    @property
    def counters(self) -> PolicyCounters: ...

def policy_names() -> list[str]: ...
def make_policy(name: str, config: PolicyConfig) -> Policy: ...

# ---------------------------------------------------------------- eval
class CrossNodeTransfers:
    @property
    def dedup(self) -> int: ...
    @property
    def no_dedup(self) -> int: ...

def cross_node_transfers(batch: RoutingBatch, exec_rank: ArrayLike,
                         topology: Topology) -> CrossNodeTransfers: ...
def rank_loads(exec_rank: ArrayLike, num_ranks: int) -> I64: ...
def imbalance(loads: ArrayLike) -> float: ...
def max_violation(expert_counts: ArrayLike) -> float: ...
def min_max_rank_load(expert_counts: ArrayLike, layout: ExpertLayout) -> int:
    """The lowest maximum rank load any assignment of expert_counts [E] reaches on the layout."""
def imbalance_floor(expert_counts: ArrayLike, layout: ExpertLayout) -> float:
    """min_max_rank_load / mean rank load (1.0 without tasks)."""
def token_bytes(token_copies: int, hidden: int, bytes_per_element: int) -> float: ...
def time_step_operations(batch: RoutingBatch, topology: Topology, slots_per_rank: int,
                         eps: float = 0.15, seed: int = 0, step: int = 0, layer: int = 0,
                         num_threads: int = 1, reps: int = 5, max_seconds: float = 10.0,
                         token_bytes: float = 8192.0,
                         expert_param_bytes: float = 34603008.0) -> list[dict[str, Any]]:
    """Wall-clock timing of the per-step calls and whole cobalt / cobalt+ / topoep steps on one
    batch (`cobalt bench`): one dict per row with name, what, policy_step, median_ms, min_ms,
    reps, items, unit, copy_ratio, note. Measured on this machine, not modelled."""

class StepMetrics:
    @property
    def transfers(self) -> CrossNodeTransfers: ...
    @property
    def rank_loads(self) -> I64: ...
    @property
    def expert_counts(self) -> I64: ...
    @property
    def imbalance(self) -> float: ...
    @property
    def max_violation(self) -> float: ...

def step_metrics(batch: RoutingBatch, exec_rank: ArrayLike, topology: Topology) -> StepMetrics: ...

class TraceStatsOptions:
    hot_count: int
    num_ranks: int
    num_threads: int
    def __init__(self, hot_count: int = 8, num_ranks: int = 0, num_threads: int = 1) -> None: ...

class LayerTraceStats:
    load_max_mean: float
    load_max_mean_step: float
    ochiai_count_weighted: Optional[float]
    ochiai_top_partner: Optional[float]
    hot_set_churn: Optional[float]
    static_ep_imbalance: Optional[float]
    source_locality: Optional[float]

class TraceStats:
    num_experts: int
    top_k: int
    num_layers: int
    num_tokens: int
    num_steps: int
    num_sources: int
    load_only: bool
    load_max_mean: float
    load_max_mean_step: float
    ochiai_count_weighted: Optional[float]
    ochiai_top_partner: Optional[float]
    hot_set_churn: Optional[float]
    static_ep_imbalance: Optional[float]
    source_locality: Optional[float]
    layers: list[LayerTraceStats]

# ---------------------------------------------------------------- io
class TraceData:
    @overload
    def __init__(self, num_experts: int, topk_ids: ArrayLike,
                 step_offsets: Optional[ArrayLike] = None, source_rank: Optional[ArrayLike] = None,
                 num_sources: int = 0, metadata: dict[str, str] = ...) -> None:
        """Token trace from topk_ids [L, T, K] (step_offsets [S + 1], source_rank [T])."""
    @overload
    def __init__(self, num_experts: int, top_k: int, counts: ArrayLike, num_sources: int = 0,
                 metadata: dict[str, str] = ...) -> None:
        """Load-only trace from counts [S, L, R, E]."""
    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_sources(self) -> int: ...
    @property
    def num_count_steps(self) -> int: ...
    metadata: dict[str, str]
    @property
    def topk_ids(self) -> I32:
        """[L, T, K] read-only view."""
    @property
    def step_offsets(self) -> I64: ...
    @property
    def source_rank(self) -> I32: ...
    @property
    def counts(self) -> I32:
        """[S, L, R, E] read-only view (load-only traces)."""

def validate_trace_data(data: TraceData, context: str = "trace") -> None: ...
def write_trace(path: str, data: TraceData) -> None: ...

class TraceReader:
    def __init__(self, path: str) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def has_token_ids(self) -> bool: ...
    @property
    def has_source_rank(self) -> bool: ...
    @property
    def has_counts(self) -> bool: ...
    @property
    def num_sources(self) -> int: ...
    @property
    def metadata(self) -> dict[str, str]: ...
    @property
    def step_offsets(self) -> I64: ...
    def topk_ids(self, layer: int, begin: int = 0, end: Optional[int] = None) -> I32:
        """[end - begin, K], zero-copy from the mapping for aligned I32 data."""
    def source_rank(self, begin: int = 0, end: Optional[int] = None) -> I32: ...
    def counts(self, step: int, layer: int) -> I32:
        """[R, E] of a load-only trace."""
    def load(self) -> TraceData: ...

@overload
def compute_trace_stats(trace: TraceReader, options: TraceStatsOptions = ...) -> TraceStats: ...
@overload
def compute_trace_stats(trace: TraceData, options: TraceStatsOptions = ...) -> TraceStats: ...
