// min_max_rank_load and imbalance_floor (metrics.hpp): the lowest maximum rank load a layout
// allows, by a binary search on the bound with a max-flow feasibility check per bound
// (plan/rank_bound_flow.hpp, shared with the replica swaps that lower it).
#include <algorithm>
#include <numeric>

#include "../plan/rank_bound_flow.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::eval {

int64_t min_max_rank_load(std::span<const int64_t> expert_counts, const ExpertLayout& layout) {
  const int num_experts = layout.num_experts(), num_ranks = layout.num_ranks();
  COBALT_CHECK_ARG(static_cast<int64_t>(expert_counts.size()) == num_experts,
                   "balance floor: {} expert counts for a layout of {} experts",
                   expert_counts.size(), num_experts);
  int64_t total = 0;
  for (ExpertId e = 0; e < num_experts; ++e) {
    const int64_t count = expert_counts[e];
    COBALT_CHECK_ARG(count >= 0, "balance floor: expert {} has {} tasks (must be >= 0)", e, count);
    if (count == 0) continue;
    COBALT_CHECK_INTERNAL(layout.num_replicas_of(e) > 0, "balance floor: expert {} has no replica",
                          e);
    COBALT_CHECK_ARG(count <= (int64_t{1} << 52) - total,
                     "balance floor: more than 2^52 tasks in all");
    total += count;
  }
  return plan::detail::min_max_load(expert_counts, num_ranks,
                                    [&](ExpertId e) { return layout.ranks_of(e); });
}

double imbalance_floor(std::span<const int64_t> expert_counts, const ExpertLayout& layout) {
  const int64_t floor_load = min_max_rank_load(expert_counts, layout);
  const int64_t total = std::accumulate(expert_counts.begin(), expert_counts.end(), int64_t{0});
  if (total == 0) return 1.0;
  return static_cast<double>(floor_load) * layout.num_ranks() / static_cast<double>(total);
}

double whole_task_imbalance_bound(int64_t num_tasks, int num_ranks) {
  COBALT_CHECK_ARG(num_tasks >= 0, "whole-task bound: num_tasks {} must be >= 0", num_tasks);
  COBALT_CHECK_ARG(num_ranks >= 1, "whole-task bound: num_ranks {} must be >= 1", num_ranks);
  if (num_tasks == 0) return 1.0;
  // ceil(num_tasks / num_ranks) without overflow near INT64_MAX.
  const int64_t busiest = num_tasks / num_ranks + (num_tasks % num_ranks != 0);
  return static_cast<double>(busiest) * num_ranks / static_cast<double>(num_tasks);
}

}  // namespace cobalt::eval
