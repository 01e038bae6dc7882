#include "cobalt/plan/smartmoe_planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

// Demand [G, E] with every task coming from source rank 0.
std::vector<double> from_rank0(int num_ranks, const std::vector<double>& load) {
  std::vector<double> demand(num_ranks * load.size(), 0.0);
  std::copy(load.begin(), load.end(), demand.begin());
  return demand;
}

TEST(SmartMoePlanner, FullReplicaBudget) {
  EXPECT_EQ(smartmoe_max_full_replicas(8, 4, 2), 0);  // 7 singles > 4 x 1 slots
  EXPECT_EQ(smartmoe_max_full_replicas(8, 4, 3), 1);  // 7 <= 4 x 2; 6 > 4 x 1
  EXPECT_EQ(smartmoe_max_full_replicas(3, 2, 2), 1);  // 2 <= 2 x 1
  EXPECT_EQ(smartmoe_max_full_replicas(8, 1, 8), 0);  // one rank: nothing to replicate
}

TEST(SmartMoePlanner, GreedyPlacementByDescendingLoad) {
  // 2 ranks, 4 experts, 2 slots, no full replicas possible. Static EP: {0, 1} = 12, {2, 3} = 6.
  // Greedy: 7 -> r0, 5 -> r1, 4 -> r1 (5 < 7), 2 -> r0 (7 < 9): both ranks 9.
  const auto current = ExpertLayout::static_ep(Topology(1, 2), 4, 2);
  const auto plan = plan_smartmoe(current, from_rank0(2, {7, 5, 4, 2}));
  ASSERT_TRUE(plan.changed);
  EXPECT_DOUBLE_EQ(plan.current_max_rank_load, 12);
  EXPECT_DOUBLE_EQ(plan.placement.max_rank_load, 9);
  EXPECT_EQ(plan.placement.num_full_replicas, 0);
  const auto& layout = plan.placement.layout;
  EXPECT_TRUE(layout.holds(0, 0) && layout.holds(0, 3));
  EXPECT_TRUE(layout.holds(1, 1) && layout.holds(1, 2));
  // Planning again from the new layout keeps it: the greedy one is not strictly better.
  const auto again = plan_smartmoe(layout, from_rank0(2, {7, 5, 4, 2}));
  EXPECT_FALSE(again.changed);
  EXPECT_EQ(again.placement.layout, layout);
}

TEST(SmartMoePlanner, RanksKeepAnEvenNumberOfSingleReplicas) {
  // 2 ranks with 4 slots, 4 experts: SmartMoE keeps E / G = 2 experts per rank. Loads 10, 1, 1, 1:
  // 10 -> r0, then r1 takes 1 and 1 and is full, so the last 1 goes to r0 (11), although r1
  // has free slots (filling them would give 10 / 3).
  const auto current = ExpertLayout::static_ep(Topology(1, 2), 4, 4);
  const auto placed = smartmoe_greedy_placement(current, from_rank0(2, {10, 1, 1, 1}), 0);
  for (RankId r = 0; r < 2; ++r) {
    const auto slots = placed.layout.slots_of(r);
    EXPECT_EQ(std::count_if(slots.begin(), slots.end(), [](ExpertId e) { return e != kEmptySlot; }),
              2)
        << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(placed.max_rank_load, 11);
  // With one full replica, ceil(3 / 2) = 2 singles per rank at most.
  const auto with_full = smartmoe_greedy_placement(current, from_rank0(2, {10, 1, 1, 1}), 1);
  for (RankId r = 0; r < 2; ++r) {
    const auto slots = with_full.layout.slots_of(r);
    EXPECT_LE(std::count_if(slots.begin(), slots.end(), [](ExpertId e) { return e != kEmptySlot; }),
              3)
        << "rank " << r;
  }
}

TEST(SmartMoePlanner, TiesKeepExpertsWhereTheyAre) {
  // No load at all: every rank ties, so each expert stays on its current rank when it has room.
  const auto current = ExpertLayout::from_rank_lists(Topology(1, 2), 2, 1, {{1}, {0}});
  const auto placed = smartmoe_greedy_placement(current, std::vector<double>(4, 0.0), 0);
  EXPECT_EQ(placed.layout, current);
}

TEST(SmartMoePlanner, FullyReplicatesTheHotExpertWhenThatLowersTheBusiestRank) {
  // 2 ranks, 3 experts, 2 slots: at most one full replica. Expert 0 has 100 tasks, half from each
  // rank; experts 1 and 2 have 10 each. Singles only: max 100. Expert 0 everywhere: each rank runs
  // its own 50, plus 10 each: max 60.
  std::vector<double> demand{50, 10, 0, 50, 0, 10};
  const auto current = ExpertLayout::static_ep(Topology(1, 2), 3, 2);
  const auto plan = plan_smartmoe(current, demand);
  ASSERT_TRUE(plan.changed);
  EXPECT_EQ(plan.placement.num_full_replicas, 1);
  EXPECT_EQ(plan.placement.layout.num_replicas_of(0), 2);
  EXPECT_EQ(plan.placement.layout.num_replicas_of(1), 1);
  EXPECT_EQ(plan.placement.layout.num_replicas_of(2), 1);
  EXPECT_DOUBLE_EQ(plan.placement.max_rank_load, 60);
  EXPECT_THROW(smartmoe_greedy_placement(current, demand, 2), Error);
}

}  // namespace
}  // namespace cobalt::plan
