// count_routing: exact loads and co-activation counts of one batch (include/cobalt/stats/
// routing_stats.hpp), and the simple reference it must equal.
//
// The fast path counts each pair of a token once, in selection order, unrolled for the common K,
// per chunk of tokens (one per thread; integer sums, so any thread count gives the same counts),
// then folds the two triangles into the symmetric matrix tile by tile.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt {
namespace {

void check_outputs(int num_experts, std::span<int64_t> expert_counts,
                   std::span<int64_t> coactivation, const char* what) {
  const size_t matrix_size = static_cast<size_t>(num_experts) * num_experts;
  COBALT_CHECK_ARG(expert_counts.size() == static_cast<size_t>(num_experts) &&
                       coactivation.size() == matrix_size,
                   "{}: outputs sized {} and {}, need [E]={} and [E,E]={}", what,
                   expert_counts.size(), coactivation.size(), num_experts, matrix_size);
}

// Tokens [begin, end): loads into `loads` [E] and each pair of a token once, at (row[a], row[b])
// for a < b (selection order), into `coact` [E, E]; mirror_fold makes the matrix symmetric.
// Counting each pair at (min, max) instead, to touch only the upper triangle, was measured 1.5-7x
// slower: a data-dependent min / max costs more than the footprint it saves (the notes in
// docs/performance.md).
template <int kTopK>
void count_chunk(const ExpertId* ids, int top_k_runtime, int num_experts, int64_t begin,
                 int64_t end, int64_t* loads, int64_t* coact) {
  const int top_k = kTopK > 0 ? kTopK : top_k_runtime;
  for (int64_t t = begin; t < end; ++t) {
    const ExpertId* row = ids + t * top_k;
    for (int a = 0; a < top_k; ++a) {
      ++loads[row[a]];
      int64_t* coact_row = coact + static_cast<size_t>(row[a]) * num_experts;
      for (int b = a + 1; b < top_k; ++b) ++coact_row[row[b]];
    }
  }
}

void count_chunk_any(const ExpertId* ids, int top_k, int num_experts, int64_t begin, int64_t end,
                     int64_t* loads, int64_t* coact) {
  switch (top_k) {  // the common K unrolled
    case 2:
      return count_chunk<2>(ids, top_k, num_experts, begin, end, loads, coact);
    case 4:
      return count_chunk<4>(ids, top_k, num_experts, begin, end, loads, coact);
    case 6:
      return count_chunk<6>(ids, top_k, num_experts, begin, end, loads, coact);
    case 8:
      return count_chunk<8>(ids, top_k, num_experts, begin, end, loads, coact);
    default:
      return count_chunk<0>(ids, top_k, num_experts, begin, end, loads, coact);
  }
}

// coact[i, j] = coact[j, i] = coact[i, j] + coact[j, i] for i < j, in square tiles so that the
// column accesses stay within a few cache lines per row (a plain row-by-column loop strides
// through the whole matrix per row: E = 1024 is 8 MB).
void mirror_fold(int num_experts, int64_t* coact) {
  constexpr int kTile = 64;
  const size_t stride = static_cast<size_t>(num_experts);
  for (int i0 = 0; i0 < num_experts; i0 += kTile) {
    const int i1 = std::min(num_experts, i0 + kTile);
    for (int j0 = i0; j0 < num_experts; j0 += kTile) {
      const int j1 = std::min(num_experts, j0 + kTile);
      for (int i = i0; i < i1; ++i) {
        int64_t* row = coact + static_cast<size_t>(i) * stride;
        for (int j = std::max(j0, i + 1); j < j1; ++j) {
          int64_t& lower = coact[static_cast<size_t>(j) * stride + static_cast<size_t>(i)];
          row[j] += lower;
          lower = row[j];
        }
      }
    }
  }
}

}  // namespace

void count_routing(const RoutingBatch& batch, std::span<int64_t> expert_counts,
                   std::span<int64_t> coactivation, int num_threads) {
  const int num_experts = batch.num_experts();
  check_outputs(num_experts, expert_counts, coactivation, "count_routing");
  check_threads(num_threads, "count_routing");
  const int top_k = batch.top_k();
  const int64_t num_tokens = batch.num_tokens();
  num_threads = resolve_threads(num_threads);
  // Each chunk accumulates into its own matrices; chunk 0 writes straight into the outputs.
  int num_chunks = static_cast<int>(std::clamp<int64_t>(num_tokens / 65536, 1, num_threads));
  const size_t matrix_size = static_cast<size_t>(num_experts) * num_experts;
  // The chunks after the first hold an [E, E] matrix each: fewer chunks (the same sums) where
  // they would take more than half the memory budget.
  const double budget = num_chunks > 1 ? memory_budget_bytes() : 0.0;  // one chunk: no extra
  while (budget > 0 && num_chunks > 1 &&
         (num_chunks - 1) * 8.0 * static_cast<double>(matrix_size) > 0.5 * budget) {
    --num_chunks;
  }
  std::vector<std::vector<int64_t>> partial_loads(num_chunks - 1,
                                                  std::vector<int64_t>(num_experts));
  std::vector<std::vector<int64_t>> partial_coact(num_chunks - 1,
                                                  std::vector<int64_t>(matrix_size));
  std::fill(expert_counts.begin(), expert_counts.end(), 0);
  std::fill(coactivation.begin(), coactivation.end(), 0);
  const ExpertId* ids = batch.topk_ids().data();
  parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
    int64_t* loads = c == 0 ? expert_counts.data() : partial_loads[c - 1].data();
    int64_t* coact = c == 0 ? coactivation.data() : partial_coact[c - 1].data();
    count_chunk_any(ids, top_k, num_experts, begin, end, loads, coact);
  });
  for (int c = 0; c + 1 < num_chunks; ++c) {
    for (int e = 0; e < num_experts; ++e) expert_counts[e] += partial_loads[c][e];
    for (size_t i = 0; i < matrix_size; ++i) coactivation[i] += partial_coact[c][i];
  }
  mirror_fold(num_experts, coactivation.data());
}

void count_routing_reference(const RoutingBatch& batch, std::span<int64_t> expert_counts,
                             std::span<int64_t> coactivation) {
  const int num_experts = batch.num_experts();
  check_outputs(num_experts, expert_counts, coactivation, "count_routing_reference");
  std::fill(expert_counts.begin(), expert_counts.end(), 0);
  std::fill(coactivation.begin(), coactivation.end(), 0);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    auto row = batch.experts_of(t);
    for (size_t a = 0; a < row.size(); ++a) {
      ++expert_counts[row[a]];
      for (size_t b = 0; b < row.size(); ++b) {
        if (a != b) ++coactivation[static_cast<size_t>(row[a]) * num_experts + row[b]];
      }
    }
  }
}

}  // namespace cobalt
