// GPU routing statistics: private per-block histograms (shared memory) or global counters, then a
// finalize kernel that sums partials and writes the symmetric int64 co-activation matrix.
#include <type_traits>

#include "cobalt/cuda/routing_stats.hpp"
#include "detail/runtime.hpp"
#include "detail/simt.hpp"
#include "detail/stats_body.hpp"

namespace cobalt::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kFinalizeThreads = 256;

using detail::stats_num_counters;

// kMaxK > 0: the row lives in registers (K <= kMaxK); kMaxK == 0: any K, read from memory.
// Grid-stride over chunks of kThreads tokens; each warp counts 32 of them (detail/stats_body.hpp).
template <int kMaxK, bool kAggregate, bool kShared>
__global__ void __launch_bounds__(kThreads)
    count_kernel(const int32_t* __restrict__ ids, int64_t num_tokens, int top_k, int num_experts,
                 uint32_t* __restrict__ partials,
                 unsigned long long* __restrict__ global_counters) {
  using Counter = std::conditional_t<kShared, unsigned int, unsigned long long>;
  extern __shared__ unsigned int shared_counters[];
  const int64_t entries = stats_num_counters(num_experts);
  Counter* counters;
  if constexpr (kShared) {
    for (int64_t i = threadIdx.x; i < entries; i += kThreads) shared_counters[i] = 0;
    __syncthreads();
    counters = shared_counters;
  } else {
    counters = global_counters;
  }
  const detail::DeviceWarp warp;
  const int64_t warp_offset = static_cast<int64_t>(threadIdx.x / 32) * 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads + warp_offset; base < num_tokens;
       base += stride) {
    detail::stats_count_warp<kMaxK, kAggregate>(warp, ids, base, num_tokens, top_k, num_experts,
                                                counters);
  }
  if constexpr (kShared) {
    __syncthreads();
    uint32_t* out = partials + static_cast<int64_t>(blockIdx.x) * entries;
    for (int64_t i = threadIdx.x; i < entries; i += kThreads) out[i] = shared_counters[i];
  }
}

// Block row y <= E of the output grid, one thread per column (detail::stats_finalize_entry).
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(int num_experts, int num_partials, const uint32_t* __restrict__ partials,
                    const unsigned long long* __restrict__ global_counters,
                    int64_t* __restrict__ expert_counts, int64_t* __restrict__ coactivation) {
  // E + 1 rows on gridDim.x (gridDim.y would cap E at 65534).
  detail::stats_finalize_entry(
      static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y * kFinalizeThreads + threadIdx.x),
      num_experts, num_partials, partials, global_counters, expert_counts, coactivation);
}

bool is_shared(StatsMethod method) {
  return method == StatsMethod::kSharedAggregated || method == StatsMethod::kSharedPlain;
}

size_t shared_bytes(int num_experts) {
  return sizeof(uint32_t) * static_cast<size_t>(stats_num_counters(num_experts));
}

StatsMethod resolve(int num_experts, StatsMethod method) {
  if (method != StatsMethod::kAuto) return method;
  const auto& info = detail::current_device_info();
  return shared_bytes(num_experts) <= static_cast<size_t>(info.max_shared_per_block_optin)
             ? StatsMethod::kSharedAggregated
             : StatsMethod::kGlobalAggregated;
}

template <int kMaxK, bool kAggregate, bool kShared>
const void* kernel_for() {
  return reinterpret_cast<const void*>(&count_kernel<kMaxK, kAggregate, kShared>);
}

// The kernel instance for (K, method).
const void* select_kernel(int top_k, StatsMethod method) {
  const bool shared = is_shared(method);
  const bool aggregate = method != StatsMethod::kSharedPlain;
#define COBALT_STATS_PICK(K)                                   \
  if (shared && aggregate) return kernel_for<K, true, true>(); \
  if (shared) return kernel_for<K, false, true>();             \
  return kernel_for<K, true, false>();
  if (top_k <= 2) {
    COBALT_STATS_PICK(2)
  }
  if (top_k <= 4) {
    COBALT_STATS_PICK(4)
  }
  if (top_k <= 8) {
    COBALT_STATS_PICK(8)
  }
  if (top_k <= 16) {
    COBALT_STATS_PICK(16)
  }
  COBALT_STATS_PICK(0)
#undef COBALT_STATS_PICK
}

// Blocks of the count kernel: as many as fit on the device at once, at most one per 1024 tokens.
int count_blocks(int64_t num_tokens, int top_k, int num_experts, StatsMethod method) {
  const auto& info = detail::current_device_info();
  const void* kernel = select_kernel(top_k, method);
  const size_t smem = is_shared(method) ? shared_bytes(num_experts) : 0;
  if (is_shared(method)) {
    detail::allow_dynamic_shared(kernel, smem, "routing count kernel");
  }
  const int per_sm = detail::max_active_blocks_per_sm(
      kernel, kThreads, smem, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (count_kernel)");
  const int64_t by_device = static_cast<int64_t>(info.num_sms) * (per_sm > 0 ? per_sm : 1);
  const int64_t by_tokens = (num_tokens + kThreads - 1) / kThreads;
  const int64_t blocks = by_tokens < by_device ? by_tokens : by_device;
  return static_cast<int>(blocks > 0 ? blocks : 1);
}

}  // namespace

bool routing_counts_supported(int num_experts, StatsMethod method) {
  if (!is_shared(method)) return true;
  return shared_bytes(num_experts) <=
         static_cast<size_t>(detail::current_device_info().max_shared_per_block_optin);
}

size_t routing_counts_workspace_bytes(int64_t num_tokens, int top_k, int num_experts,
                                      StatsMethod method) {
  method = resolve(num_experts, method);
  if (is_shared(method)) {
    const int blocks = count_blocks(num_tokens, top_k, num_experts, method);
    return detail::carve_size<uint32_t>(static_cast<size_t>(blocks) *
                                        static_cast<size_t>(stats_num_counters(num_experts)));
  }
  return detail::carve_size<unsigned long long>(
      static_cast<size_t>(stats_num_counters(num_experts)));
}

void count_routing(const int32_t* topk_ids, int64_t num_tokens, int top_k, int num_experts,
                   int64_t* expert_counts, int64_t* coactivation, void* workspace,
                   size_t workspace_bytes, Stream stream, StatsMethod method) {
  detail::require(top_k >= 1, "cuda count_routing: top_k must be >= 1");
  detail::require(num_experts >= 1 && num_experts <= 65536,
                  "cuda count_routing: num_experts out of range [1, 65536]");
  detail::require(num_tokens >= 0, "cuda count_routing: negative token count");
  detail::require(expert_counts && coactivation, "cuda count_routing: null output");
  method = resolve(num_experts, method);
  detail::require(routing_counts_supported(num_experts, method),
                  "cuda count_routing: the shared-memory histograms do not fit for this E");
  detail::require(
      workspace_bytes >= routing_counts_workspace_bytes(num_tokens, top_k, num_experts, method),
      "cuda count_routing: workspace smaller than routing_counts_workspace_bytes()");
  detail::require_aligned(expert_counts, 8, "cuda count_routing: outputs must be 8-byte aligned");
  detail::require_aligned(coactivation, 8, "cuda count_routing: outputs must be 8-byte aligned");
  cudaStream_t st = detail::as_stream(stream);
  const bool shared = is_shared(method);
  const int64_t entries = stats_num_counters(num_experts);
  detail::WorkspaceCarver carve(workspace, workspace_bytes);
  uint32_t* partials = nullptr;
  unsigned long long* global_counters = nullptr;
  int blocks = 1;
  if (shared) {
    blocks = count_blocks(num_tokens, top_k, num_experts, method);
    partials = carve.take<uint32_t>(static_cast<size_t>(blocks) * entries);
  } else {
    global_counters = carve.take<unsigned long long>(static_cast<size_t>(entries));
  }
  detail::require_no_pending_error("cuda count_routing");
  if (!shared) {
    detail::check(cudaMemsetAsync(global_counters, 0, sizeof(unsigned long long) * entries, st),
                  "cudaMemsetAsync (stats counters)");
    const auto& info = detail::current_device_info();
    const int64_t by_tokens = (num_tokens + kThreads - 1) / kThreads;
    const int64_t by_device = static_cast<int64_t>(info.num_sms) * 2;
    blocks = static_cast<int>(by_tokens < by_device ? (by_tokens > 0 ? by_tokens : 1) : by_device);
  }
  const void* kernel = select_kernel(top_k, method);
  const size_t smem = shared ? shared_bytes(num_experts) : 0;
  if (num_tokens > 0 || shared) {
    // (With no tokens the shared variant still runs to write zero partials.)
    void* args[] = {(void*)&topk_ids, &num_tokens, &top_k,
                    &num_experts,     &partials,   &global_counters};
    detail::check(cudaLaunchKernel(kernel, dim3(blocks), dim3(kThreads), args, smem, st),
                  "count_kernel");
  }
  const dim3 grid(num_experts + 1, (num_experts + kFinalizeThreads - 1) / kFinalizeThreads);
  finalize_kernel<<<grid, kFinalizeThreads, 0, st>>>(num_experts, shared ? blocks : 0, partials,
                                                     global_counters, expert_counts, coactivation);
  detail::check(cudaGetLastError(), "finalize_kernel");
}

}  // namespace cobalt::cuda
