// Shared by the floor-swap tests (floor_swaps_test.cpp, swap_search_test.cpp,
// rank_bound_flow_test.cpp): random counts, costs, holder lists and small layouts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::plan::testing_floor_swaps {

inline std::vector<int64_t> random_counts(SplitMix64& rng, int num_experts, int64_t max_count) {
  std::vector<int64_t> counts(num_experts);
  for (auto& c : counts) c = static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_count) + 1));
  // A few hot experts, so that layouts have floors above the mean.
  for (int i = 0; i < std::max(1, num_experts / 4); ++i) {
    counts[rng.below(num_experts)] += static_cast<int64_t>(rng.below(4 * max_count + 1));
  }
  return counts;
}

inline std::vector<double> random_costs(SplitMix64& rng, int num_nodes, int num_experts) {
  std::vector<double> cost(static_cast<size_t>(num_nodes) * num_experts);
  for (auto& c : cost) c = static_cast<double>(rng.below(100));
  return cost;
}

// [E] sorted holder lists without a layout: each rank holds each expert with probability
// 1 / one_in, and an expert with none gets one random rank.
inline std::vector<std::vector<RankId>> random_holders(SplitMix64& rng, int num_experts,
                                                       int num_ranks, uint64_t one_in) {
  std::vector<std::vector<RankId>> holders(num_experts);
  for (auto& h : holders) {
    for (RankId r = 0; r < num_ranks; ++r) {
      if (rng.below(one_in) == 0) h.push_back(r);
    }
    if (h.empty()) h.push_back(static_cast<RankId>(rng.below(num_ranks)));
  }
  return holders;
}

// A small random instance: 1 to max_nodes nodes of 1 to max_per_node ranks, 1 to max_slots
// slots per rank, some of them filled, and skewed counts up to about 5 x 12 tasks per expert.
struct SmallInstance {
  Topology topo;
  ExpertLayout layout;
  std::vector<int64_t> counts;
  std::vector<double> costs;
};

inline SmallInstance small_instance(uint64_t seed, SplitMix64& rng, int max_nodes, int max_per_node,
                                    int max_slots) {
  const int nodes = 1 + static_cast<int>(rng.below(max_nodes)),
            per_node = 1 + static_cast<int>(rng.below(max_per_node));
  const Topology topo(nodes, nodes * per_node);
  const int slots = 1 + static_cast<int>(rng.below(max_slots));
  const int experts = 1 + static_cast<int>(rng.below(topo.num_ranks() * slots));
  auto layout = testing::random_layout(seed, topo, experts, slots, 0.8);
  auto counts = random_counts(rng, experts, 12);
  auto costs = random_costs(rng, nodes, experts);
  return {topo, std::move(layout), std::move(counts), std::move(costs)};
}

}  // namespace cobalt::plan::testing_floor_swaps
