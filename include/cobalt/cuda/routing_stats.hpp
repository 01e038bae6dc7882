// Routing statistics of one batch on the GPU: exactly cobalt::count_routing's integers.
//   expert_counts [E]    tasks per expert
//   coactivation  [E, E] tokens selecting both i and j (symmetric; the diagonal counts rows that
//                        repeat an id, so it is 0 for valid batches, as on the CPU)
//
// Method: each block (one per SM, grid-stride over tokens) keeps private 32-bit histograms of the
// loads and the upper triangle of the pair counts in shared memory, E (E + 1) / 2 + E counters,
// when they fit the device's opt-in shared memory (E <= ~330 on H100/H200); block partials are
// summed by a second kernel that writes the symmetric int64 matrix. Larger E: the same counters in
// global memory (64-bit atomics). Under skew many lanes of a warp hit the same counter; the default
// aggregates equal keys within a warp first (__match_any_sync) so a hot pair costs one atomic per
// warp, not 32 serialised ones.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cobalt/cuda/common.hpp"

namespace cobalt::cuda {

enum class StatsMethod {
  kAuto,              // shared-memory histograms with warp aggregation when they fit, else global
  kSharedAggregated,  // shared-memory histograms, equal keys of a warp merged first
  kSharedPlain,       // shared-memory histograms, one atomic per pair (for comparison)
  kGlobalAggregated,  // global 64-bit counters, equal keys of a warp merged first
};

// Workspace bytes for the given shape on the current device (the block count depends on it).
size_t routing_counts_workspace_bytes(int64_t num_tokens, int top_k, int num_experts,
                                      StatsMethod method = StatsMethod::kAuto);

// Whether `method` can run for E experts on the current device (shared methods need the
// histograms to fit in shared memory).
bool routing_counts_supported(int num_experts, StatsMethod method);

// topk_ids [T, K] (ids in [0, E), K >= 1), expert_counts [E] and coactivation [E, E] out.
void count_routing(const int32_t* topk_ids, int64_t num_tokens, int top_k, int num_experts,
                   int64_t* expert_counts, int64_t* coactivation, void* workspace,
                   size_t workspace_bytes, Stream stream, StatsMethod method = StatsMethod::kAuto);

}  // namespace cobalt::cuda
