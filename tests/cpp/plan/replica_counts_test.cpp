#include "cobalt/plan/replica_counts.hpp"

#include <gtest/gtest.h>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::plan {
namespace {

TEST(ReplicaCounts, HottestPerReplicaGetsTheNextReplica) {
  // Start 1 each (3 used). 6/1 is the largest -> 2. Then 6/2 = 3/1: tie, lower id wins -> 3.
  const std::vector<double> load{6, 3, 1};
  EXPECT_EQ(proportional_replica_counts(load, 5, 1, 3), (std::vector<int>{3, 1, 1}));
  // One more slot: 6/3 = 2 < 3/1 -> expert 1.
  EXPECT_EQ(proportional_replica_counts(load, 6, 1, 3), (std::vector<int>{3, 2, 1}));
}

TEST(ReplicaCounts, NodeStepStartsSpreadAndGrowsByNodes) {
  // 2 nodes: 2 * 2 <= 8, so both start with 2; expert 0 then grows by 2 twice.
  EXPECT_EQ(proportional_replica_counts(std::vector<double>{8, 1}, 8, 2, 8),
            (std::vector<int>{6, 2}));
  // No room for one per node (6 > 5): start with 1. Expert 0 grows by 1 to 2 (the node step), then
  // its +2 does not fit and it is frozen; expert 1 (tied with 2, lower id) takes the last slot.
  EXPECT_EQ(proportional_replica_counts(std::vector<double>{8, 1, 1}, 5, 2, 8),
            (std::vector<int>{2, 2, 1}));
}

TEST(ReplicaCounts, FreezesWhenTheIncrementDoesNotFit) {
  // Start 2, 2 (4 used). Expert 0 -> 4 (6 used); its next +2 exceeds max 4: frozen. Expert 1's +2
  // exceeds the budget of 7: frozen. One slot stays unused.
  EXPECT_EQ(proportional_replica_counts(std::vector<double>{10, 1}, 7, 2, 4),
            (std::vector<int>{4, 2}));
}

TEST(ReplicaCounts, StaysWithinBudgetAndBoundsOnRandomInputs) {
  SplitMix64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int num_experts = 1 + static_cast<int>(rng.below(20));
    const int node_step = 1 + static_cast<int>(rng.below(4));
    const int max_per = 1 + static_cast<int>(rng.below(8));
    const int total = num_experts + static_cast<int>(rng.below(3 * num_experts));
    std::vector<double> load(num_experts);
    for (auto& w : load) w = rng.unit() < 0.2 ? 0.0 : 100 * rng.unit();
    const auto counts = proportional_replica_counts(load, total, node_step, max_per);
    int sum = 0;
    for (int c : counts) {
      EXPECT_GE(c, 1);
      EXPECT_LE(c, std::max(max_per, 1));
      sum += c;
    }
    EXPECT_LE(sum, total);
    // With node_step 1 and room for everyone at max, every slot is spent.
    if (node_step == 1 && total <= num_experts * max_per) EXPECT_EQ(sum, total);
  }
}

TEST(ReplicaCounts, RejectsBadArguments) {
  const std::vector<double> load{1, 2};
  EXPECT_THROW(proportional_replica_counts(load, 1, 1, 2), Error);
  EXPECT_THROW(proportional_replica_counts(load, 4, 0, 2), Error);
  EXPECT_THROW(proportional_replica_counts(std::vector<double>{1, -1}, 4, 1, 2), Error);
}

}  // namespace
}  // namespace cobalt::plan
