#include "cobalt/plan/floor_swaps.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "cobalt/core/error.hpp"
#include "rank_bound_flow.hpp"

namespace cobalt::plan {
namespace {

struct Candidate {
  double price;
  bool cross_node_copy;  // e has no replica on r's node yet
  int64_t neg_count;     // -count of e: busier experts first
  RankId rank;
  int slot;
  ExpertId expert;
  auto key() const { return std::tie(price, cross_node_copy, neg_count, rank, slot); }
};

void remove_rank(std::vector<RankId>& ranks, RankId r) {
  ranks.erase(std::find(ranks.begin(), ranks.end(), r));
}

void insert_rank(std::vector<RankId>& ranks, RankId r) {
  ranks.insert(std::upper_bound(ranks.begin(), ranks.end(), r), r);
}

}  // namespace

FloorSwapResult swap_toward_floor(const ExpertLayout& layout,
                                  std::span<const int64_t> expert_counts,
                                  std::span<const double> removal_cost,
                                  const FloorSwapOptions& options) {
  const int num_experts = layout.num_experts(), num_ranks = layout.num_ranks();
  const int num_nodes = layout.num_nodes(), slots = layout.slots_per_rank();
  const int per_node = layout.topology().ranks_per_node();
  COBALT_CHECK_ARG(static_cast<int64_t>(expert_counts.size()) == num_experts,
                   "floor swaps: {} expert counts for a layout of {} experts", expert_counts.size(),
                   num_experts);
  COBALT_CHECK_ARG(removal_cost.size() == static_cast<size_t>(num_nodes) * num_experts,
                   "floor swaps: {} removal costs, expected N x E = {} x {}", removal_cost.size(),
                   num_nodes, num_experts);
  COBALT_CHECK_ARG(std::isfinite(options.tolerance) && options.tolerance >= 0,
                   "floor swaps: tolerance {} must be finite and >= 0", options.tolerance);
  COBALT_CHECK_ARG(options.max_swaps >= 0, "floor swaps: max_swaps {} must be >= 0",
                   options.max_swaps);
  COBALT_CHECK_ARG(options.max_checks >= 1, "floor swaps: max_checks {} must be >= 1",
                   options.max_checks);
  int64_t total = 0;
  for (ExpertId e = 0; e < num_experts; ++e) {
    COBALT_CHECK_ARG(expert_counts[e] >= 0, "floor swaps: expert {} has {} tasks (must be >= 0)", e,
                     expert_counts[e]);
    COBALT_CHECK_ARG(expert_counts[e] <= (int64_t{1} << 52) - total,
                     "floor swaps: more than 2^52 tasks in all");
    total += expert_counts[e];
  }
  for (size_t i = 0; i < removal_cost.size(); ++i) {
    COBALT_CHECK_ARG(std::isfinite(removal_cost[i]) && removal_cost[i] >= 0,
                     "floor swaps: removal cost {} of (node {}, expert {}) must be finite and >= 0",
                     removal_cost[i], i / num_experts, i % num_experts);
  }

  std::vector<ExpertId> new_slots(layout.slots().begin(), layout.slots().end());
  std::vector<std::vector<RankId>> holders(num_experts);
  for (ExpertId e = 0; e < num_experts; ++e) {
    holders[e].assign(layout.ranks_of(e).begin(), layout.ranks_of(e).end());
  }
  const auto holders_of = [&](ExpertId e) -> const std::vector<RankId>& { return holders[e]; };
  FloorSwapResult result{layout, {}, 0, 0};
  int64_t floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
  result.floor_before = floor;
  // ceil((1 + tolerance) * total / G), as the spill's cap (balanced_cover.hpp).
  const auto target = static_cast<int64_t>(
      std::ceil((1.0 + options.tolerance) * static_cast<double>(total) / num_ranks));
  detail::TightSet tight;
  std::vector<Candidate> candidates;
  for (int swap = 0; swap < options.max_swaps && floor > target; ++swap) {
    const bool fits =
        detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, total, &tight);
    COBALT_CHECK_INTERNAL(!fits, "floor swaps: the floor {} is not the lowest bound", floor);
    candidates.clear();
    for (ExpertId e = 0; e < num_experts; ++e) {
      if (!tight.experts[e] || expert_counts[e] == 0) continue;
      for (RankId r = 0; r < num_ranks; ++r) {
        if (tight.ranks[r]) continue;  // every holder of X is marked, so r does not hold e
        const NodeId n = r / per_node;
        const bool cross_node_copy = std::none_of(holders[e].begin(), holders[e].end(),
                                                  [&](RankId h) { return h / per_node == n; });
        for (int s = 0; s < slots; ++s) {
          const ExpertId f = new_slots[static_cast<size_t>(r) * slots + s];
          double price = 0;
          if (f != kEmptySlot) {
            if (holders[f].size() < 2) continue;  // its only replica
            const bool kept_on_node =
                std::count_if(holders[f].begin(), holders[f].end(),
                              [&](RankId h) { return h / per_node == n; }) >= 2;
            if (!kept_on_node) price = removal_cost[static_cast<size_t>(n) * num_experts + f];
          }
          candidates.push_back({price, cross_node_copy, -expert_counts[e], r, s, e});
        }
      }
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.key() < b.key(); });
    const auto num_checks =
        std::min<size_t>(candidates.size(), static_cast<size_t>(options.max_checks));
    bool applied = false;
    for (size_t i = 0; i < num_checks && !applied; ++i) {
      const Candidate& c = candidates[i];
      const size_t idx = static_cast<size_t>(c.rank) * slots + c.slot;
      const ExpertId f = new_slots[idx];
      insert_rank(holders[c.expert], c.rank);
      if (f != kEmptySlot) remove_rank(holders[f], c.rank);
      if (detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, total)) {
        new_slots[idx] = c.expert;
        result.swaps.push_back({c.rank, c.slot, f, c.expert});
        floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
        applied = true;
      } else {
        remove_rank(holders[c.expert], c.rank);
        if (f != kEmptySlot) insert_rank(holders[f], c.rank);
      }
    }
    if (!applied) break;
  }
  result.floor_after = floor;
  if (!result.swaps.empty()) {
    result.layout = ExpertLayout(layout.topology(), num_experts, slots, std::move(new_slots));
  }
  return result;
}

}  // namespace cobalt::plan
