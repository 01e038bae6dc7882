// min_max_rank_load and imbalance_floor (metrics.hpp): the lowest maximum rank load a layout
// allows, by a binary search on the bound with a max-flow feasibility check per bound.
#include <algorithm>
#include <numeric>

#include "../plan/max_flow.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::eval {
namespace {

// True when every task fits with at most `bound` tasks per rank: a flow of `total` from the
// source through the experts (their counts) and their holders (uncapped) to the sink (`bound`
// per rank). Capacities are integers below 2^53, so the double-valued flow is exact.
bool fits_under(std::span<const int64_t> expert_counts, const ExpertLayout& layout, int64_t bound,
                int64_t total) {
  const int num_experts = layout.num_experts(), num_ranks = layout.num_ranks();
  const int source = num_experts + num_ranks, sink = source + 1;
  plan::MaxFlow flow(num_experts + num_ranks + 2);
  for (ExpertId e = 0; e < num_experts; ++e) {
    const auto count = static_cast<double>(expert_counts[e]);
    if (expert_counts[e] == 0) continue;
    flow.add_edge(source, e, count);
    for (RankId r : layout.ranks_of(e)) flow.add_edge(e, num_experts + r, count);
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    flow.add_edge(num_experts + r, sink, static_cast<double>(bound));
  }
  return flow.run(source, sink, 0.5) > static_cast<double>(total) - 0.5;
}

}  // namespace

int64_t min_max_rank_load(std::span<const int64_t> expert_counts, const ExpertLayout& layout) {
  const int num_experts = layout.num_experts(), num_ranks = layout.num_ranks();
  COBALT_CHECK_ARG(static_cast<int64_t>(expert_counts.size()) == num_experts,
                   "balance floor: {} expert counts for a layout of {} experts",
                   expert_counts.size(), num_experts);
  int64_t total = 0;
  int64_t lower = 0;  // no rank below the mean, no expert below an even split over its replicas
  std::vector<int64_t> even_split(num_ranks, 0);  // a feasible assignment: its maximum bounds above
  for (ExpertId e = 0; e < num_experts; ++e) {
    const int64_t count = expert_counts[e];
    COBALT_CHECK_ARG(count >= 0, "balance floor: expert {} has {} tasks (must be >= 0)", e, count);
    if (count == 0) continue;
    const auto ranks = layout.ranks_of(e);
    COBALT_CHECK_INTERNAL(!ranks.empty(), "balance floor: expert {} has no replica", e);
    COBALT_CHECK_ARG(count <= (int64_t{1} << 52) - total,
                     "balance floor: more than 2^52 tasks in all");
    total += count;
    const auto num_holders = static_cast<int64_t>(ranks.size());
    lower = std::max(lower, (count + num_holders - 1) / num_holders);
    for (size_t i = 0; i < ranks.size(); ++i) {
      even_split[ranks[i]] += count / num_holders + (static_cast<int64_t>(i) < count % num_holders);
    }
  }
  if (total == 0) return 0;
  lower = std::max(lower, (total + num_ranks - 1) / num_ranks);
  int64_t upper = *std::max_element(even_split.begin(), even_split.end());
  // The lower bound is often the answer: one flow then settles it.
  if (lower < upper) {
    if (fits_under(expert_counts, layout, lower, total)) return lower;
    ++lower;
  }
  while (lower < upper) {
    const int64_t mid = lower + (upper - lower) / 2;
    if (fits_under(expert_counts, layout, mid, total)) {
      upper = mid;
    } else {
      lower = mid + 1;
    }
  }
  return upper;
}

double imbalance_floor(std::span<const int64_t> expert_counts, const ExpertLayout& layout) {
  const int64_t floor_load = min_max_rank_load(expert_counts, layout);
  const int64_t total = std::accumulate(expert_counts.begin(), expert_counts.end(), int64_t{0});
  if (total == 0) return 1.0;
  return static_cast<double>(floor_load) * layout.num_ranks() / static_cast<double>(total);
}

}  // namespace cobalt::eval
