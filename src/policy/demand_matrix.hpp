// Internal: the per-(source rank, expert) task counts of a batch — the routing matrix Omega that
// per-microbatch policies (TopoEP, UltraEP) plan from, and the shape load-only traces carry.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "cobalt/core/error.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::policy {

// out: [G, E] with G = batch.num_ranks(), E = batch.num_experts(); overwritten.
inline void count_demand(const RoutingBatch& batch, std::span<int64_t> out) {
  const int num_experts = batch.num_experts();
  COBALT_CHECK_INTERNAL(out.size() == static_cast<size_t>(batch.num_ranks()) * num_experts,
                        "count_demand: output has {} entries, expected {} x {}", out.size(),
                        batch.num_ranks(), num_experts);
  std::fill(out.begin(), out.end(), 0);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    int64_t* row = out.data() + static_cast<size_t>(batch.source_of(t)) * num_experts;
    for (ExpertId e : batch.experts_of(t)) row[e] += 1;
  }
}

// Checks a load-only counts matrix [G, E] from run_loads(): size and non-negative entries.
inline void check_counts(std::span<const int64_t> counts, int num_ranks, int num_experts,
                         const char* policy) {
  COBALT_CHECK_ARG(counts.size() == static_cast<size_t>(num_ranks) * num_experts,
                   "policy {}: counts has {} entries, expected {} ranks x {} experts", policy,
                   counts.size(), num_ranks, num_experts);
  for (size_t i = 0; i < counts.size(); ++i) {
    COBALT_CHECK_ARG(counts[i] >= 0, "policy {}: counts[{}][{}] = {} is negative", policy,
                     i / num_experts, i % num_experts, counts[i]);
  }
}

}  // namespace cobalt::policy
