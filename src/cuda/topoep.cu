// GPU TopoEP solver: seven kernels over detail/topoep_body.hpp (see
// include/cobalt/cuda/topoep.hpp).
#include <cmath>

#include "cobalt/cuda/topoep.hpp"
#include "detail/runtime.hpp"
#include "detail/topoep_body.hpp"

namespace cobalt::cuda {
namespace {

using detail::TopoMove;
using detail::TopoNodeState;
using detail::TopoShape;
using detail::TopoWork;

constexpr int kPlaceThreads = 256;
constexpr int kRouteThreads = 128;
constexpr int kWarpsPerBlock = 4;  // quota kernels: one warp per expert or source rank

// One block per node. The node's candidates are ranked by a bitonic sort of their keys in shared
// memory when `sort_size` > 0 (topo_place_sort_size), else by counting (topo_place_phase_b).
__global__ void __launch_bounds__(kPlaceThreads)
    place_kernel(TopoShape s, TopoWork w, int sort_size) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, node = blockIdx.x;
  detail::topo_place_phase_a(tid, kPlaceThreads, s, w, node);
  __syncthreads();
  if (sort_size == 0) {
    detail::topo_place_phase_b(tid, kPlaceThreads, s, w, node);
    return;
  }
  auto* keys = reinterpret_cast<detail::TopoSortKey*>(smem);
  detail::topo_sort_keys(tid, kPlaceThreads, s, w, node, keys, sort_size);
  __syncthreads();
  for (int k = 2; k <= sort_size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      detail::topo_sort_stage(tid, kPlaceThreads, keys, sort_size, k, j);
      __syncthreads();
    }
  }
  detail::topo_place_sorted(tid, kPlaceThreads, s, w, node, keys, sort_size);
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(TopoShape s, TopoWork w) {
  const int e = blockIdx.x * kRouteThreads + threadIdx.x;
  if (e < s.num_experts) detail::topo_route_expert(s, w, e);
}

// One warp per node; the node's slot tables and loads in shared memory when `staged`.
__global__ void __launch_bounds__(32) refine_kernel(TopoShape s, TopoWork w, bool staged) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int node = blockIdx.x;
  const int M = s.per_node, S = s.slots;
  const int first = node * M;
  TopoNodeState global{w.slot_expert + static_cast<int64_t>(first) * S,
                       w.slot_load + static_cast<int64_t>(first) * S, w.slot_used + first,
                       w.replicas_used + first, w.rank_loads + first};
  TopoNodeState st = global;
  if (staged) {
    st.slot_load = reinterpret_cast<int64_t*>(smem);
    st.loads = st.slot_load + M * S;
    st.slot_expert = reinterpret_cast<int32_t*>(st.loads + M);
    st.slot_used = st.slot_expert + M * S;
    st.replicas_used = st.slot_used + M;
    for (int i = threadIdx.x; i < M * S; i += 32) {
      st.slot_load[i] = global.slot_load[i];
      st.slot_expert[i] = global.slot_expert[i];
    }
    for (int i = threadIdx.x; i < M; i += 32) {
      st.loads[i] = global.loads[i];
      st.slot_used[i] = global.slot_used[i];
      st.replicas_used[i] = global.replicas_used[i];
    }
    __syncwarp();
  }
  const detail::DeviceWarp warp;
  detail::topo_refine_node(warp, s, w, st, node);
  if (staged) {
    __syncwarp();
    for (int i = threadIdx.x; i < M * S; i += 32) {
      global.slot_load[i] = st.slot_load[i];
      global.slot_expert[i] = st.slot_expert[i];
    }
    for (int i = threadIdx.x; i < M; i += 32) {
      global.loads[i] = st.loads[i];
      global.slot_used[i] = st.slot_used[i];
      global.replicas_used[i] = st.replicas_used[i];
    }
  }
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock) emit_kernel(TopoShape s, TopoWork w) {
  const int e = blockIdx.x * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  if (e >= s.num_experts) return;  // whole warps exit together
  detail::topo_emit_expert(detail::DeviceWarp{}, s, w, e);
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock) count_kernel(TopoShape s, TopoWork w) {
  const int src = blockIdx.x * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  if (src >= s.num_ranks) return;
  detail::topo_count_source(detail::DeviceWarp{}, s, w, src);
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    write_kernel(TopoShape s, TopoWork w, int64_t* source_offsets, TopoEpDeviceQuota* quotas,
                 int64_t capacity) {
  const int src = blockIdx.x * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  if (src >= s.num_ranks) return;
  detail::topo_write_source(detail::DeviceWarp{}, s, w, src, source_offsets, quotas, capacity);
}

__global__ void __launch_bounds__(kRouteThreads)
    slots_kernel(TopoShape s, TopoWork w, int32_t* slots, int64_t* rank_loads) {
  const int r = blockIdx.x * kRouteThreads + threadIdx.x;
  if (r < s.num_ranks) detail::topo_slots_rank(s, w, r, slots, rank_loads);
}

}  // namespace

int64_t topoep_quota_capacity(int num_ranks, int slots_per_rank) {
  return static_cast<int64_t>(num_ranks) * num_ranks * slots_per_rank;
}

namespace {

// Validates what the CPU solver validates (shapes) and derives the kernels' shape.
TopoShape shape_of(const TopoEpDeviceInput& in) {
  const int G = in.num_ranks, E = in.num_experts, N = in.num_nodes;
  detail::require(E >= 1, "cuda topoep: number of experts must be >= 1");
  detail::require(N >= 1 && N <= 64 && G >= N && G % N == 0,
                  "cuda topoep: num_nodes must be in [1, 64] and divide num_ranks");
  const int mains_per_rank = (E + G - 1) / G;
  detail::require(in.slots_per_rank >= mains_per_rank,
                  "cuda topoep: slots_per_rank cannot hold the main instances");
  detail::require(in.max_moves_per_node >= 1, "cuda topoep: max_moves_per_node must be >= 1");
  detail::require(std::isfinite(in.token_bytes) && in.token_bytes >= 0 &&
                      std::isfinite(in.expert_param_bytes) && in.expert_param_bytes >= 0,
                  "cuda topoep: token bytes and expert parameter bytes must be finite and >= 0");
  return TopoShape{G,
                   E,
                   N,
                   G / N,
                   in.slots_per_rank,
                   in.max_moves_per_node,
                   in.token_bytes,
                   in.expert_param_bytes};
}

}  // namespace

size_t topoep_workspace_bytes(const TopoEpDeviceInput& input) {
  return detail::topo_carve(shape_of(input), nullptr, false).bytes;
}

void solve_topoep(const TopoEpDeviceInput& in, const TopoEpDeviceOutput& out, void* workspace,
                  size_t workspace_bytes, Stream stream) {
  const TopoShape s = shape_of(in);
  const int G = s.num_ranks, E = s.num_experts, N = s.num_nodes;
  detail::require(in.demand != nullptr, "cuda topoep: null demand");
  detail::require(
      out.slots && out.source_offsets && out.quotas && out.rank_loads && out.stats && out.status,
      "cuda topoep: null output");
  detail::require(workspace_bytes >= topoep_workspace_bytes(in),
                  "cuda topoep: workspace smaller than topoep_workspace_bytes()");
  detail::require_aligned(workspace, 256, "cuda topoep: the workspace must be 256-byte aligned");
  // A misaligned int64 store faults, and that error is sticky (the whole context is lost).
  for (const void* p :
       {static_cast<const void*>(out.slots), static_cast<const void*>(out.status)}) {
    detail::require_aligned(p, 4, "cuda topoep: slots and status must be 4-byte aligned");
  }
  for (const void* p :
       {static_cast<const void*>(in.demand), static_cast<const void*>(out.source_offsets),
        static_cast<const void*>(out.quotas), static_cast<const void*>(out.rank_loads),
        static_cast<const void*>(out.stats)}) {
    detail::require_aligned(
        p, 8,
        "cuda topoep: demand, source_offsets, quotas, rank_loads and stats must "
        "be 8-byte aligned");
  }
  detail::require_no_pending_error("cuda topoep");
  cudaStream_t st = detail::as_stream(stream);
  TopoWork w = detail::topo_carve(s, workspace, true).work;
  w.demand = in.demand;
  w.stats = out.stats;
  w.status = out.status;

  detail::check(cudaMemsetAsync(w.num_candidates, 0, detail::topo_zero_bytes(s, w), st),
                "cudaMemsetAsync (topoep)");
  detail::check(cudaMemsetAsync(out.stats, 0, 4 * sizeof(int64_t), st),
                "cudaMemsetAsync (topoep stats)");
  detail::check(cudaMemsetAsync(out.status, 0, sizeof(int32_t), st),
                "cudaMemsetAsync (topoep status)");

  const int sort_size = detail::topo_place_sort_size(s);
  place_kernel<<<N, kPlaceThreads, sort_size * sizeof(detail::TopoSortKey), st>>>(s, w, sort_size);
  detail::check(cudaGetLastError(), "topoep place_kernel");
  route_kernel<<<(E + kRouteThreads - 1) / kRouteThreads, kRouteThreads, 0, st>>>(s, w);
  detail::check(cudaGetLastError(), "topoep route_kernel");

  const size_t node_bytes = static_cast<size_t>(s.per_node) *
                            (static_cast<size_t>(s.slots) * (sizeof(int64_t) + sizeof(int32_t)) +
                             sizeof(int64_t) + 2 * sizeof(int32_t));
  const bool staged = node_bytes <= 48 * 1024;
  refine_kernel<<<N, 32, staged ? node_bytes : 0, st>>>(s, w, staged);
  detail::check(cudaGetLastError(), "topoep refine_kernel");

  const unsigned expert_blocks = static_cast<unsigned>((E + kWarpsPerBlock - 1) / kWarpsPerBlock);
  emit_kernel<<<expert_blocks, 32 * kWarpsPerBlock, 0, st>>>(s, w);
  detail::check(cudaGetLastError(), "topoep emit_kernel");
  const unsigned source_blocks = static_cast<unsigned>((G + kWarpsPerBlock - 1) / kWarpsPerBlock);
  count_kernel<<<source_blocks, 32 * kWarpsPerBlock, 0, st>>>(s, w);
  detail::check(cudaGetLastError(), "topoep count_kernel");
  write_kernel<<<source_blocks, 32 * kWarpsPerBlock, 0, st>>>(s, w, out.source_offsets, out.quotas,
                                                              out.quota_capacity);
  detail::check(cudaGetLastError(), "topoep write_kernel");
  slots_kernel<<<(G + kRouteThreads - 1) / kRouteThreads, kRouteThreads, 0, st>>>(s, w, out.slots,
                                                                                  out.rank_loads);
  detail::check(cudaGetLastError(), "topoep slots_kernel");
}

}  // namespace cobalt::cuda
