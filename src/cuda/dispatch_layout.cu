// GPU dispatch layout: count pass (ballots per warp and rank), per-rank scan over chunks, slot
// pass.
#include "cobalt/cuda/dispatch_layout.hpp"
#include "detail/dispatch_body.hpp"
#include "detail/runtime.hpp"

namespace cobalt::cuda {
namespace {

using detail::DispatchShape;
using detail::kDispatchChunk;
using detail::kDispatchWarps;

constexpr int kThreads = kDispatchChunk;
constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kThreads)
    dispatch_count_kernel(DispatchShape s, int64_t num_chunks, int32_t* __restrict__ chunk_counts,
                          int64_t* __restrict__ node_counts, int64_t* __restrict__ pair_counts) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* ballots = reinterpret_cast<uint32_t*>(smem);  // [warps, G]
  __shared__ long long node_hist[64];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t chunk = blockIdx.x;
  const int64_t base = chunk * kDispatchChunk + 32 * warp;
  if (threadIdx.x < 64) node_hist[threadIdx.x] = 0;
  __syncthreads();
  const detail::DeviceWarp w;
  detail::dispatch_warp_ballots(w, s, base, ballots + warp * s.num_ranks);
  detail::dispatch_warp_nodes(w, s, base, reinterpret_cast<int64_t*>(node_hist));
  __syncthreads();
  detail::dispatch_chunk_counts(threadIdx.x, kThreads, s.num_ranks, ballots, chunk, num_chunks,
                                chunk_counts);
  if (threadIdx.x < s.num_nodes && node_hist[threadIdx.x] != 0) {
    detail::atomic_add_i64(&node_counts[threadIdx.x], node_hist[threadIdx.x]);
  }
  if (pair_counts == nullptr) return;
  // One source for the whole chunk (the usual case: tokens grouped by source rank): the chunk's
  // counts are that source's row; else per-warp aggregated atomics.
  const int64_t first = chunk * kDispatchChunk;
  const int64_t t = first + threadIdx.x;
  const int32_t src0 = s.src[first];
  const bool uniform = __syncthreads_and(t >= s.num_tokens || s.src[t] == src0);
  if (uniform) {
    for (int d = threadIdx.x; d < s.num_ranks; d += kThreads) {
      int32_t c = 0;
      for (int wi = 0; wi < kDispatchWarps; ++wi) c += __popc(ballots[wi * s.num_ranks + d]);
      if (c != 0)
        detail::atomic_add_i64(&pair_counts[static_cast<int64_t>(src0) * s.num_ranks + d], c);
    }
  } else {
    detail::dispatch_warp_pairs(w, s, base, ballots + warp * s.num_ranks, pair_counts);
  }
}

// Block d: exclusive scan of chunk_counts[d, :] in place; rank_counts[d] = total. The last block
// to finish writes rank_offsets.
__global__ void __launch_bounds__(kScanThreads)
    dispatch_scan_kernel(int num_ranks, int64_t num_chunks, int32_t* __restrict__ chunk_counts,
                         int64_t* __restrict__ rank_counts, int64_t* __restrict__ rank_offsets,
                         unsigned int* __restrict__ done) {
  __shared__ long long warp_sums[kScanThreads / 32];
  __shared__ bool last;
  const int d = blockIdx.x;
  int32_t* row = chunk_counts + d * num_chunks;
  const int64_t per_thread = (num_chunks + kScanThreads - 1) / kScanThreads;
  const int64_t begin = threadIdx.x * per_thread;
  const int64_t end = begin + per_thread < num_chunks ? begin + per_thread : num_chunks;
  long long local = 0;
  for (int64_t i = begin; i < end; ++i) local += row[i];
  // Block-wide exclusive scan of the per-thread sums.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long inclusive = local;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const long long v = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long v = warp_sums[lane];
    for (int offset = 1; offset < 32; offset <<= 1) {
      const long long u = __shfl_up_sync(0xffffffffu, v, offset);
      if (lane >= offset) v += u;
    }
    warp_sums[lane] = v;  // inclusive over warps
  }
  __syncthreads();
  long long running = inclusive - local + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int64_t i = begin; i < end; ++i) {
    const int32_t c = row[i];
    row[i] = static_cast<int32_t>(running);
    running += c;
  }
  if (threadIdx.x == 0) {
    rank_counts[d] = warp_sums[kScanThreads / 32 - 1];
    __threadfence();
    last = atomicAdd(done, 1u) == static_cast<unsigned>(num_ranks - 1);
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    long long total = 0;
    const volatile int64_t* counts = rank_counts;
    for (int r = 0; r < num_ranks; ++r) {
      rank_offsets[r] = total;
      total += counts[r];
    }
    rank_offsets[num_ranks] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    dispatch_slot_kernel(DispatchShape s, int64_t num_chunks,
                         const int32_t* __restrict__ chunk_base,
                         const int64_t* __restrict__ rank_offsets, int32_t* __restrict__ slot,
                         uint8_t* __restrict__ token_in_rank) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* ballots = reinterpret_cast<uint32_t*>(smem);      // [warps, G]
  uint32_t* prefix = ballots + kDispatchWarps * s.num_ranks;  // [warps, G]
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t chunk = blockIdx.x;
  const int64_t base = chunk * kDispatchChunk + 32 * warp;
  const detail::DeviceWarp w;
  detail::dispatch_warp_ballots(w, s, base, ballots + warp * s.num_ranks);
  __syncthreads();
  if (slot != nullptr) {
    detail::dispatch_warp_prefix(threadIdx.x, kThreads, s.num_ranks, ballots, prefix);
    __syncthreads();
    detail::dispatch_warp_slots(w, s, base, chunk, num_chunks, ballots + warp * s.num_ranks,
                                prefix + warp * s.num_ranks, chunk_base, rank_offsets, slot);
  }
  if (token_in_rank != nullptr) {
    detail::dispatch_warp_flags(w, s, base, ballots + warp * s.num_ranks, token_in_rank);
  }
}

int64_t chunks_of(int64_t num_tokens) { return (num_tokens + kDispatchChunk - 1) / kDispatchChunk; }

}  // namespace

size_t dispatch_layout_workspace_bytes(int64_t num_tokens, int num_ranks) {
  return detail::carve_size<int32_t>(static_cast<size_t>(chunks_of(num_tokens)) * num_ranks) +
         detail::carve_size<unsigned int>(1);
}

void dispatch_layout(const int32_t* exec_rank, const int32_t* source_rank, int64_t num_tokens,
                     int top_k, int num_nodes, int num_ranks, const DispatchLayoutOutputs& out,
                     void* workspace, size_t workspace_bytes, Stream stream) {
  detail::require(top_k >= 1 && top_k <= detail::kDispatchMaxTopK,
                  "cuda dispatch layout: top_k out of range [1, 64]");
  detail::require(num_ranks >= 1 && num_ranks <= detail::kDispatchMaxRanks,
                  "cuda dispatch layout: num_ranks out of range [1, 2048]");
  detail::require(num_nodes >= 1 && num_nodes <= 64 && num_ranks % num_nodes == 0,
                  "cuda dispatch layout: num_nodes must be in [1, 64] and divide num_ranks");
  detail::require(num_tokens >= 0, "cuda dispatch layout: negative token count");
  detail::require(out.rank_counts && out.node_counts && out.rank_offsets,
                  "cuda dispatch layout: rank_counts, node_counts and rank_offsets are required");
  detail::require(out.pair_counts == nullptr || source_rank != nullptr,
                  "cuda dispatch layout: pair_counts needs source_rank");
  detail::require(num_tokens * top_k < (int64_t{1} << 31),
                  "cuda dispatch layout: T * K must stay below 2^31 (int32 slots)");
  detail::require(workspace_bytes >= dispatch_layout_workspace_bytes(num_tokens, num_ranks),
                  "cuda dispatch layout: workspace smaller than dispatch_layout_workspace_bytes()");
  for (const void* p :
       {static_cast<const void*>(out.rank_counts), static_cast<const void*>(out.node_counts),
        static_cast<const void*>(out.rank_offsets), static_cast<const void*>(out.pair_counts)}) {
    detail::require_aligned(p, 8, "cuda dispatch layout: int64 outputs must be 8-byte aligned");
  }
  cudaStream_t st = detail::as_stream(stream);
  const int64_t num_chunks = chunks_of(num_tokens);
  detail::WorkspaceCarver carve(workspace, workspace_bytes);
  int32_t* chunk_counts = carve.take<int32_t>(static_cast<size_t>(num_chunks) * num_ranks);
  unsigned int* done = carve.take<unsigned int>(1);
  detail::require_no_pending_error("cuda dispatch layout");
  // What depends on the device is checked before anything is enqueued too.
  const size_t count_smem = sizeof(uint32_t) * kDispatchWarps * num_ranks;
  const size_t slot_smem = 2 * count_smem;
  const auto& info = detail::current_device_info();
  // The slot kernel (2x the count kernel's shared memory) runs only when its outputs are asked.
  const bool wants_slots = out.slot != nullptr || out.token_in_rank != nullptr;
  detail::require((wants_slots ? slot_smem : count_smem) <=
                      static_cast<size_t>(info.max_shared_per_block_optin),
                  "cuda dispatch layout: too many ranks for this device's shared memory");
  if (num_chunks > 0) {
    detail::allow_dynamic_shared(reinterpret_cast<const void*>(&dispatch_count_kernel), count_smem,
                                 "dispatch_count_kernel");
    if (wants_slots) {
      detail::allow_dynamic_shared(reinterpret_cast<const void*>(&dispatch_slot_kernel), slot_smem,
                                   "dispatch_slot_kernel");
    }
  }

  detail::check(cudaMemsetAsync(out.node_counts, 0, sizeof(int64_t) * num_nodes, st),
                "cudaMemsetAsync (node_counts)");
  if (out.pair_counts != nullptr) {
    detail::check(cudaMemsetAsync(out.pair_counts, 0,
                                  sizeof(int64_t) * static_cast<size_t>(num_ranks) * num_ranks, st),
                  "cudaMemsetAsync (pair_counts)");
  }
  detail::check(cudaMemsetAsync(done, 0, sizeof(unsigned int), st), "cudaMemsetAsync (done)");
  const DispatchShape shape{exec_rank, source_rank, num_tokens,           top_k,
                            num_ranks, num_nodes,   num_ranks / num_nodes};
  if (num_chunks > 0) {
    dispatch_count_kernel<<<static_cast<unsigned>(num_chunks), kThreads, count_smem, st>>>(
        shape, num_chunks, chunk_counts, out.node_counts, out.pair_counts);
    detail::check(cudaGetLastError(), "dispatch_count_kernel");
  }
  dispatch_scan_kernel<<<num_ranks, kScanThreads, 0, st>>>(num_ranks, num_chunks, chunk_counts,
                                                           out.rank_counts, out.rank_offsets, done);
  detail::check(cudaGetLastError(), "dispatch_scan_kernel");
  if (num_chunks > 0 && wants_slots) {
    dispatch_slot_kernel<<<static_cast<unsigned>(num_chunks), kThreads, slot_smem, st>>>(
        shape, num_chunks, chunk_counts, out.rank_offsets, out.slot, out.token_in_rank);
    detail::check(cudaGetLastError(), "dispatch_slot_kernel");
  }
}

}  // namespace cobalt::cuda
