// Internal: the flow behind a layout's balance floor (eval::min_max_rank_load) and the replica
// swaps that lower it (floor_swaps.hpp). Source -> expert e (capacity: its task count) -> every
// rank holding e (uncapped) -> sink (capacity `bound` per rank): every task fits with at most
// `bound` tasks per rank exactly when the maximum flow carries all of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "max_flow.hpp"

namespace cobalt::plan::detail {

// When every task fits under `bound`. `holders_of(e)` gives e's ranks (any range of RankId).
// With `tight` non-null and the answer false, *tight receives the experts [E] and ranks [G] on the
// source side of a minimum cut (1 = on it): a set X of experts whose tasks exceed `bound` times
// the number of ranks holding any of them (those ranks are exactly the ranks marked), so no
// assignment fits until some expert of X gets a holder outside them. Capacities are integers
// below 2^53, so the double-valued flow is exact.
struct TightSet {
  std::vector<uint8_t> experts;  // [E]
  std::vector<uint8_t> ranks;    // [G]
};

template <class HoldersOf>
bool fits_under(std::span<const int64_t> expert_counts, int num_ranks, HoldersOf&& holders_of,
                int64_t bound, int64_t total, TightSet* tight = nullptr) {
  const int num_experts = static_cast<int>(expert_counts.size());
  const int source = num_experts + num_ranks, sink = source + 1;
  MaxFlow flow(num_experts + num_ranks + 2);
  for (ExpertId e = 0; e < num_experts; ++e) {
    if (expert_counts[e] == 0) continue;
    const auto count = static_cast<double>(expert_counts[e]);
    flow.add_edge(source, e, count);
    for (RankId r : holders_of(e)) flow.add_edge(e, num_experts + r, count);
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    flow.add_edge(num_experts + r, sink, static_cast<double>(bound));
  }
  const bool fits = flow.run(source, sink, 0.5) > static_cast<double>(total) - 0.5;
  if (tight != nullptr && !fits) {
    tight->experts.assign(num_experts, 0);
    tight->ranks.assign(num_ranks, 0);
    for (ExpertId e = 0; e < num_experts; ++e) tight->experts[e] = flow.on_source_side(e);
    for (RankId r = 0; r < num_ranks; ++r) tight->ranks[r] = flow.on_source_side(num_experts + r);
  }
  return fits;
}

// The lowest bound every task fits under, searched in [lower, upper] where upper is known to fit
// and lower is a valid lower bound (a binary search of fits_under checks).
template <class HoldersOf>
int64_t lowest_fitting_bound(std::span<const int64_t> expert_counts, int num_ranks,
                             HoldersOf&& holders_of, int64_t lower, int64_t upper, int64_t total) {
  // The lower bound is often the answer: one flow then settles it.
  if (lower < upper) {
    if (fits_under(expert_counts, num_ranks, holders_of, lower, total)) return lower;
    ++lower;
  }
  while (lower < upper) {
    const int64_t mid = lower + (upper - lower) / 2;
    if (fits_under(expert_counts, num_ranks, holders_of, mid, total)) {
      upper = mid;
    } else {
      lower = mid + 1;
    }
  }
  return upper;
}

// The lowest maximum rank load any assignment reaches (0 without tasks): between the largest of
// the mean and each expert's even split over its holders, and the maximum of that even split
// (an assignment, so it fits). Counts must be >= 0 with every counted expert held somewhere.
template <class HoldersOf>
int64_t min_max_load(std::span<const int64_t> expert_counts, int num_ranks,
                     HoldersOf&& holders_of) {
  int64_t total = 0, lower = 0;
  std::vector<int64_t> even_split(num_ranks, 0);
  for (ExpertId e = 0; e < static_cast<ExpertId>(expert_counts.size()); ++e) {
    const int64_t count = expert_counts[e];
    if (count == 0) continue;
    const auto& ranks = holders_of(e);
    const auto num_holders = static_cast<int64_t>(std::size(ranks));
    total += count;
    lower = std::max(lower, (count + num_holders - 1) / num_holders);
    int64_t i = 0;
    for (RankId r : ranks) even_split[r] += count / num_holders + (i++ < count % num_holders);
  }
  if (total == 0) return 0;
  lower = std::max(lower, (total + num_ranks - 1) / num_ranks);
  const int64_t upper = *std::max_element(even_split.begin(), even_split.end());
  return lowest_fitting_bound(expert_counts, num_ranks, holders_of, lower, upper, total);
}

}  // namespace cobalt::plan::detail
