#include "cobalt/plan/flexmoe_planner.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

FlexMoeOptions options(double threshold, int max_ops) {
  FlexMoeOptions o;
  o.balance_threshold = threshold;
  o.max_ops = max_ops;
  return o;
}

TEST(FlexMoePlanner, BalanceRatioIsMaxOverMin) {
  EXPECT_DOUBLE_EQ(flexmoe_balance_ratio(std::vector<double>{2, 1, 1.5}), 2.0);
  EXPECT_DOUBLE_EQ(flexmoe_balance_ratio(std::vector<double>{0, 0}), 1.0);
  EXPECT_EQ(flexmoe_balance_ratio(std::vector<double>{1, 0}),
            std::numeric_limits<double>::infinity());
}

TEST(FlexMoePlanner, ExpandsTheOverloadedExpertWhileImbalanced) {
  // 2 ranks, 2 slots; expert 0 (30 tasks) on rank 0, expert 1 (10) on rank 1: ratio 3.
  const auto current = ExpertLayout::static_ep(Topology(1, 2), 2, 2);
  const std::vector<double> load{30, 10};
  // One primitive: Expand expert 0 onto rank 1 -> loads 15 | 15 + 10 (Migrate would give 0 | 40).
  const auto one = flexmoe_schedule(current, load, options(1.15, 1));
  EXPECT_EQ(one.num_expand, 1);
  EXPECT_EQ(one.num_migrate, 0);
  EXPECT_EQ(one.layout.num_replicas_of(0), 2);
  EXPECT_DOUBLE_EQ(one.balance_ratio_before, 3.0);
  EXPECT_DOUBLE_EQ(one.balance_ratio_after, 25.0 / 15.0);
  // With a threshold above 25/15 scheduling stops after that one Expand.
  const auto lenient = flexmoe_schedule(current, load, options(1.7, 10));
  EXPECT_EQ(lenient.num_expand, 1);
  // With 1.15 it goes on: rank 1 is now the busiest; expert 0 is everywhere, so expert 1 expands
  // onto rank 0: 20 | 20.
  const auto strict = flexmoe_schedule(current, load, options(1.15, 10));
  EXPECT_EQ(strict.num_expand, 2);
  EXPECT_DOUBLE_EQ(strict.balance_ratio_after, 1.0);
  EXPECT_EQ(strict.layout.num_replicas_of(1), 2);
}

TEST(FlexMoePlanner, NothingToDoWhenBalanced) {
  const auto current = ExpertLayout::static_ep(Topology(1, 2), 2, 2);
  const auto s = flexmoe_schedule(current, std::vector<double>{10, 10}, options(1.15, 10));
  EXPECT_EQ(s.num_expand + s.num_shrink + s.num_migrate, 0);
  EXPECT_EQ(s.layout, current);
}

TEST(FlexMoePlanner, ShrinksTheColdestReplicaWhenNoSlotIsFree) {
  // Rank 0 {0, 1}, rank 1 {2, 1}; loads 40, 2, 10: rank loads 41 | 11, every slot used. Expert 0
  // cannot expand into a free slot, so expert 1 (the only expert with 2 replicas) gives up its
  // replica on rank 1: 22 | 30. (A swap of 0 and 2 would give 11 | 41: no better.)
  const auto current = ExpertLayout::from_rank_lists(Topology(1, 2), 3, 2, {{0, 1}, {2, 1}});
  const auto s = flexmoe_schedule(current, std::vector<double>{40, 2, 10}, options(1.15, 1));
  EXPECT_EQ(s.num_expand, 1);
  EXPECT_EQ(s.num_shrink, 1);
  EXPECT_TRUE(s.layout.holds(1, 0));
  EXPECT_FALSE(s.layout.holds(1, 1));
  EXPECT_EQ(s.layout.num_replicas_of(1), 1);
}

TEST(FlexMoePlanner, MigratesWhenThatBeatsExpanding) {
  // Rank 0 {0, 1} with 10 + 10, rank 1 {2} idle. Expand 0 -> 15 | 5; Migrate 0 -> 10 | 10.
  const auto current = ExpertLayout::from_rank_lists(Topology(1, 2), 3, 2, {{0, 1}, {2}});
  const auto s = flexmoe_schedule(current, std::vector<double>{10, 10, 0}, options(1.15, 1));
  EXPECT_EQ(s.num_migrate, 1);
  EXPECT_EQ(s.num_expand, 0);
  EXPECT_TRUE(s.layout.holds(1, 0));
  EXPECT_FALSE(s.layout.holds(0, 0));
  EXPECT_DOUBLE_EQ(s.balance_ratio_after, 1.0);
}

TEST(FlexMoePlanner, EvenSplitRankLoads) {
  const auto layout = ExpertLayout::from_rank_lists(Topology(1, 2), 2, 2, {{0, 1}, {0}});
  EXPECT_EQ(even_split_rank_loads(layout, std::vector<double>{8, 3}), (std::vector<double>{7, 4}));
  EXPECT_THROW(even_split_rank_loads(layout, std::vector<double>{1}), Error);
}

// With the busiest load tied on two ranks (5, 5, 1) no primitive lowers the maximum, but
// expanding expert 0 onto rank 2 raises the minimum (2.5, 5, 3.5), which FlexMoE's lexicographic
// rule (max, then min) takes.
TEST(FlexMoePlanner, FlexMoeTakesAPrimitiveThatOnlyRaisesTheMinimum) {
  const auto current = ExpertLayout::static_ep(Topology(1, 3), 3, 2);
  const std::vector<double> load{5, 5, 1};
  const auto s = flexmoe_schedule(current, load, {});
  EXPECT_GE(s.num_expand, 1);
  EXPECT_LT(s.balance_ratio_after, s.balance_ratio_before);
}

}  // namespace
}  // namespace cobalt::plan
