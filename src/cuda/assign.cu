// GPU task assignment: one token per thread over detail/assign_body.hpp.
#include <cstdint>

#include "cobalt/cuda/assign.hpp"
#include "detail/assign_body.hpp"
#include "detail/runtime.hpp"

namespace cobalt::cuda {
namespace {

using detail::AssignTables;
using detail::CoverMode;

constexpr int kThreads = 256;
constexpr int kFallbackThreads = 64;  // threads per block of the deferred-token pass
constexpr int kFallbackBlocks = 16;   // its blocks; each of the 1024 threads owns a 2^K DP table

bool use_masks(assign::CoverSearch search, int num_nodes) {
  return search == assign::CoverSearch::kMaskEnumeration ||
         (search == assign::CoverSearch::kAuto && num_nodes <= 8);
}

template <int kMaxK>
__device__ __forceinline__ void load_row(const int32_t* __restrict__ ids, int64_t t, int top_k,
                                         bool vector_rows, int32_t (&row)[kMaxK]) {
  const int32_t* p = ids + t * top_k;
  if constexpr (kMaxK % 4 == 0) {
    if (vector_rows) {  // top_k == kMaxK and 16-byte aligned rows
      COBALT_UNROLL
      for (int i = 0; i < kMaxK / 4; ++i) {
        const int4 v = __ldg(reinterpret_cast<const int4*>(p) + i);
        row[4 * i] = v.x;
        row[4 * i + 1] = v.y;
        row[4 * i + 2] = v.z;
        row[4 * i + 3] = v.w;
      }
      return;
    }
  }
  COBALT_UNROLL
  for (int k = 0; k < kMaxK; ++k) row[k] = k < top_k ? __ldg(p + k) : 0;
}

template <int kMaxK>
__device__ __forceinline__ void store_row(int32_t* __restrict__ out, int64_t t, int top_k,
                                          bool vector_rows, const int32_t (&row)[kMaxK]) {
  int32_t* p = out + t * top_k;
  if constexpr (kMaxK % 4 == 0) {
    if (vector_rows) {
      COBALT_UNROLL
      for (int i = 0; i < kMaxK / 4; ++i) {
        reinterpret_cast<int4*>(p)[i] =
            make_int4(row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]);
      }
      return;
    }
  }
  COBALT_UNROLL
  for (int k = 0; k < kMaxK; ++k) {
    if (k < top_k) p[k] = row[k];
  }
}

template <int kMaxK, CoverMode kMode>
__global__ void __launch_bounds__(kThreads)
    assign_kernel(AssignTables tab, const int32_t* __restrict__ ids,
                  const int32_t* __restrict__ src, int64_t num_tokens, int top_k, uint64_t prefix,
                  int64_t token_offset, bool vector_rows, int32_t* __restrict__ exec,
                  int64_t* __restrict__ deferred, int32_t* __restrict__ num_deferred) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= num_tokens) return;
  int32_t row[kMaxK];
  int32_t out[kMaxK];
  load_row<kMaxK>(ids, t, top_k, vector_rows, row);
  const uint64_t token_h =
      token_hash(prefix, static_cast<uint64_t>(token_offset) + static_cast<uint64_t>(t));
  bool done;
  if constexpr (kMode == CoverMode::kMasks) {
    done = detail::assign_token<kMaxK>(tab, row, top_k, __ldg(src + t), token_h, kMode, nullptr, 0,
                                       out);
  } else {
    uint8_t table[1 << detail::kAssignLocalDpBits];
    done = detail::assign_token<kMaxK>(tab, row, top_k, __ldg(src + t), token_h, kMode, table,
                                       detail::kAssignLocalDpBits, out);
  }
  if (done) {
    store_row<kMaxK>(exec, t, top_k, vector_rows, out);
  } else {
    deferred[atomicAdd(num_deferred, 1)] = t;
  }
}

// Tokens whose subset DP needed more than the local table: each thread owns a 2^K-byte table.
template <int kMaxK>
__global__ void __launch_bounds__(kFallbackThreads)
    assign_deferred_kernel(AssignTables tab, const int32_t* __restrict__ ids,
                           const int32_t* __restrict__ src, int top_k, uint64_t prefix,
                           int64_t token_offset, int32_t* __restrict__ exec,
                           const int64_t* __restrict__ deferred,
                           const int32_t* __restrict__ num_deferred, uint8_t* __restrict__ tables) {
  const int count = *num_deferred;
  const int thread =
      static_cast<int>(blockIdx.x) * kFallbackThreads + static_cast<int>(threadIdx.x);
  uint8_t* table = tables + (static_cast<size_t>(thread) << top_k);
  for (int64_t i = thread; i < count; i += kFallbackBlocks * kFallbackThreads) {  // no int wrap
    const int64_t t = deferred[i];
    int32_t row[kMaxK];
    int32_t out[kMaxK];
    load_row<kMaxK>(ids, t, top_k, false, row);
    const uint64_t token_h =
        token_hash(prefix, static_cast<uint64_t>(token_offset) + static_cast<uint64_t>(t));
    detail::assign_token<kMaxK>(tab, row, top_k, src[t], token_h, CoverMode::kSubsetDp, table,
                                top_k, out);
    store_row<kMaxK>(exec, t, top_k, false, out);
  }
}

struct Launch {
  AssignTables tab;
  const int32_t* ids;
  const int32_t* src;
  int64_t num_tokens;
  int top_k;
  uint64_t prefix;
  int64_t token_offset;
  bool vector_rows;
  int32_t* exec;
  int64_t* deferred;
  int32_t* num_deferred;
  uint8_t* tables;
  cudaStream_t stream;
};

template <int kMaxK>
void launch(const Launch& a, bool masks) {
  const unsigned blocks = static_cast<unsigned>((a.num_tokens + kThreads - 1) / kThreads);
  if (masks) {
    assign_kernel<kMaxK, CoverMode::kMasks><<<blocks, kThreads, 0, a.stream>>>(
        a.tab, a.ids, a.src, a.num_tokens, a.top_k, a.prefix, a.token_offset, a.vector_rows, a.exec,
        nullptr, nullptr);
    detail::check(cudaGetLastError(), "assign_kernel (masks)");
    return;
  }
  assign_kernel<kMaxK, CoverMode::kSubsetDp><<<blocks, kThreads, 0, a.stream>>>(
      a.tab, a.ids, a.src, a.num_tokens, a.top_k, a.prefix, a.token_offset, a.vector_rows, a.exec,
      a.deferred, a.num_deferred);
  detail::check(cudaGetLastError(), "assign_kernel (subset DP)");
  if constexpr (kMaxK > detail::kAssignLocalDpBits) {
    if (a.top_k > detail::kAssignLocalDpBits) {
      assign_deferred_kernel<kMaxK><<<kFallbackBlocks, kFallbackThreads, 0, a.stream>>>(
          a.tab, a.ids, a.src, a.top_k, a.prefix, a.token_offset, a.exec, a.deferred,
          a.num_deferred, a.tables);
      detail::check(cudaGetLastError(), "assign_deferred_kernel");
    }
  }
}

}  // namespace

size_t assign_workspace_bytes(int64_t num_tokens, int top_k, int num_nodes,
                              assign::CoverSearch search) {
  if (use_masks(search, num_nodes) || top_k <= detail::kAssignLocalDpBits) return 0;
  return detail::carve_size<int32_t>(1) + detail::carve_size<int64_t>(num_tokens) +
         detail::carve_size<uint8_t>(static_cast<size_t>(kFallbackBlocks * kFallbackThreads)
                                     << top_k);
}

void assign_node_cover(const LayoutView& layout, const int32_t* topk_ids,
                       const int32_t* source_rank, int64_t num_tokens, int top_k,
                       const assign::AssignKey& key, assign::CoverSearch search, int32_t* exec_rank,
                       void* workspace, size_t workspace_bytes, Stream stream) {
  detail::require(top_k >= 1 && top_k <= detail::kAssignMaxTopK,
                  "cuda assign: top_k out of range [1, 16]");
  detail::require(num_tokens >= 0, "cuda assign: negative token count");
  detail::require(layout.num_nodes >= 1 && layout.num_nodes <= 64 && layout.num_ranks >= 1 &&
                      layout.num_ranks % layout.num_nodes == 0 && layout.num_experts >= 1,
                  "cuda assign: layout view has an invalid shape");
  detail::require(layout.node_mask && layout.node_offsets && layout.replica_ranks,
                  "cuda assign: layout view has null maps");
  const bool masks = use_masks(search, layout.num_nodes);
  detail::require(!masks || layout.num_nodes <= 20,
                  "cuda assign: mask enumeration over more than 20 nodes; use the subset DP");
  // One thread per token (gridDim.x < 2^31 blocks); the deferred-token list counts in int32.
  detail::require(num_tokens <= int64_t{INT32_MAX} * kThreads,
                  "cuda assign: more than (2^31 - 1) x 256 tokens in one call; split the batch "
                  "(token_offset keeps the draws)");
  detail::require(masks || top_k <= detail::kAssignLocalDpBits || num_tokens <= INT32_MAX,
                  "cuda assign: the subset DP at top_k > 8 takes at most 2^31 - 1 tokens per "
                  "call; split the batch (token_offset keeps the draws)");
  detail::require(
      workspace_bytes >= assign_workspace_bytes(num_tokens, top_k, layout.num_nodes, search),
      "cuda assign: workspace smaller than assign_workspace_bytes()");
  if (num_tokens == 0) return;
  detail::require(topk_ids && source_rank && exec_rank, "cuda assign: null input or output");
  const bool deferred = !masks && top_k > detail::kAssignLocalDpBits;
  if (deferred) {
    detail::require_aligned(workspace, 256, "cuda: the workspace must be 256-byte aligned");
  }
  detail::require_no_pending_error("cuda assign");

  Launch a{};
  a.tab = AssignTables{layout.node_mask, layout.node_offsets, layout.replica_ranks,
                       layout.num_nodes, layout.num_ranks / layout.num_nodes};
  a.ids = topk_ids;
  a.src = source_rank;
  a.num_tokens = num_tokens;
  a.top_k = top_k;
  a.prefix =
      counter_prefix(key.seed, static_cast<uint64_t>(key.step), static_cast<uint64_t>(key.layer));
  a.token_offset = key.token_offset;
  a.stream = detail::as_stream(stream);
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (deferred) {
    detail::WorkspaceCarver carve(workspace, workspace_bytes);
    a.num_deferred = carve.take<int32_t>(1);
    a.deferred = carve.take<int64_t>(static_cast<size_t>(num_tokens));
    a.tables =
        carve.take<uint8_t>(static_cast<size_t>(kFallbackBlocks * kFallbackThreads) << top_k);
    detail::check(cudaMemsetAsync(a.num_deferred, 0, sizeof(int32_t), a.stream),
                  "cudaMemsetAsync (deferred count)");
  }
  if (top_k == 1) {
    launch<1>(a, masks);
  } else if (top_k == 2) {
    launch<2>(a, masks);
  } else if (top_k <= 4) {
    a.vector_rows = top_k == 4 && aligned16(topk_ids) && aligned16(exec_rank);
    launch<4>(a, masks);
  } else if (top_k <= 8) {
    a.vector_rows = top_k == 8 && aligned16(topk_ids) && aligned16(exec_rank);
    launch<8>(a, masks);
  } else {
    a.vector_rows = top_k == 16 && aligned16(topk_ids) && aligned16(exec_rank);
    launch<16>(a, masks);
  }
}

}  // namespace cobalt::cuda
