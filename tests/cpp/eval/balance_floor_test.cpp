// The balance floor (min_max_rank_load, imbalance_floor in metrics.hpp): against the brute-force
// optimum on small instances, never above what an assignment reaches, and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/optimal_max_load.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

std::vector<int64_t> expert_counts_of(const RoutingBatch& batch) {
  std::vector<int64_t> counts(batch.num_experts(), 0);
  for (ExpertId e : batch.topk_ids()) ++counts[e];
  return counts;
}

TEST(BalanceFloor, EqualsTheBruteForceOptimumOnSmallInstances) {
  int num_above_the_mean = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SplitMix64 rng(seed * 104729);
    const int nodes = 1 + static_cast<int>(rng.below(3)),
              per_node = 1 + static_cast<int>(rng.below(3));
    const Topology topo(nodes, nodes * per_node);
    const int slots = 1 + static_cast<int>(rng.below(3));
    const int experts = std::max(1, static_cast<int>(rng.below(topo.num_ranks() * slots)) + 1);
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 3)));
    const auto layout = testing::random_layout(seed, topo, experts, slots, 0.6);
    const auto owned = testing::random_batch(seed * 3, static_cast<int64_t>(rng.below(50)), top_k,
                                             experts, topo.num_ranks(), 2.0);
    const auto batch = owned.view();
    const auto counts = expert_counts_of(batch);
    const int64_t floor_load = min_max_rank_load(counts, layout);
    ASSERT_EQ(floor_load, testing::optimal_max_load(batch, layout)) << "seed " << seed;
    const int64_t total = batch.num_tasks();
    num_above_the_mean += floor_load * topo.num_ranks() > total + topo.num_ranks() - 1;
    if (total == 0) {
      EXPECT_EQ(imbalance_floor(counts, layout), 1.0);
    } else {
      EXPECT_DOUBLE_EQ(imbalance_floor(counts, layout),
                       static_cast<double>(floor_load) * topo.num_ranks() / total);
    }
  }
  EXPECT_GT(num_above_the_mean, 50);  // the layout, not only the integer mean, sets many floors
}

// No assignment on the layout beats it, and the balanced assignment with spill ends at max(cap,
// floor) unless it was lower without spill (its documented guarantee), on instances larger than
// the brute force takes.
TEST(BalanceFloor, NoAssignmentGoesBelowIt) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Topology topo(4, 16);
    const auto layout = testing::random_layout(seed, topo, 48, 4, 0.5);
    const auto owned = testing::random_batch(seed * 11, 3000, 6, 48, topo.num_ranks(), 1.5);
    const auto batch = owned.view();
    const auto counts = expert_counts_of(batch);
    const int64_t floor_load = min_max_rank_load(counts, layout);
    std::vector<RankId> exec(batch.num_tasks());
    assign::assign_node_cover(batch, layout, {seed, 0, 0, 0}, {}, exec);
    const auto loads = rank_loads(exec, topo.num_ranks());
    EXPECT_LE(floor_load, *std::max_element(loads.begin(), loads.end())) << "seed " << seed;
    assign::assign_balanced_cover(batch, layout, {}, {}, exec);
    const auto plain = rank_loads(exec, topo.num_ranks());
    assign::assign_balanced_cover(batch, layout, {}, {}, exec, 0.0);
    const auto balanced = rank_loads(exec, topo.num_ranks());
    const int64_t cap = (batch.num_tasks() + topo.num_ranks() - 1) / topo.num_ranks();
    EXPECT_EQ(*std::max_element(balanced.begin(), balanced.end()),
              std::min(*std::max_element(plain.begin(), plain.end()), std::max(cap, floor_load)))
        << "seed " << seed;
  }
}

TEST(BalanceFloor, OneReplicaPerExpertFixesEveryLoad) {
  const Topology topo(2, 4);
  const auto layout = ExpertLayout::static_ep(topo, 8, 2);  // expert e alone on rank e / 2
  const std::vector<int64_t> counts = {5, 1, 0, 0, 2, 2, 7, 3};
  EXPECT_EQ(min_max_rank_load(counts, layout), 10);  // rank 3: experts 6 and 7
  EXPECT_DOUBLE_EQ(imbalance_floor(counts, layout), 10.0 * 4 / 20);
  EXPECT_EQ(min_max_rank_load(std::vector<int64_t>(8, 0), layout), 0);
  EXPECT_EQ(imbalance_floor(std::vector<int64_t>(8, 0), layout), 1.0);
}

// The whole-task bound: its values, never above a layout's floor, and reached by the floor of a
// layout where every rank holds every expert (any task can run anywhere).
TEST(BalanceFloor, WholeTaskBoundIsBelowEveryFloorAndReachedByFullReplication) {
  EXPECT_DOUBLE_EQ(whole_task_imbalance_bound(100, 32), 4.0 / 3.125);
  EXPECT_DOUBLE_EQ(whole_task_imbalance_bound(64, 32), 1.0);
  EXPECT_DOUBLE_EQ(whole_task_imbalance_bound(3, 8), 8.0 / 3.0);
  EXPECT_DOUBLE_EQ(whole_task_imbalance_bound(0, 8), 1.0);
  EXPECT_DOUBLE_EQ(whole_task_imbalance_bound(7, 1), 1.0);
  const Topology topo(2, 4);
  const int num_experts = 6;
  std::vector<std::vector<ExpertId>> every_expert(topo.num_ranks());
  for (auto& row : every_expert) {
    for (ExpertId e = 0; e < num_experts; ++e) row.push_back(e);
  }
  const auto full = ExpertLayout::from_rank_lists(topo, num_experts, num_experts, every_expert);
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed);
    std::vector<int64_t> counts(num_experts);
    for (auto& c : counts) c = static_cast<int64_t>(rng.below(seed % 3 == 0 ? 3 : 40));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const double bound = whole_task_imbalance_bound(total, topo.num_ranks());
    EXPECT_DOUBLE_EQ(imbalance_floor(counts, full), bound) << "seed " << seed;
    const auto layout = testing::random_layout(seed, topo, num_experts, 2, 0.5);
    EXPECT_GE(imbalance_floor(counts, layout), bound - 1e-12) << "seed " << seed;
  }
  EXPECT_THROW(whole_task_imbalance_bound(-1, 4), Error);
  EXPECT_THROW(whole_task_imbalance_bound(4, 0), Error);
}

TEST(BalanceFloor, RejectsBadCounts) {
  const Topology topo(2, 4);
  const auto layout = ExpertLayout::from_rank_lists(topo, 6, 2, {{0, 1}, {2}, {3}, {4, 5}});
  auto code_of = [&](std::vector<int64_t> counts) {
    try {
      min_max_rank_load(counts, layout);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;  // no error: the EXPECT below fails
  };
  EXPECT_EQ(code_of({1, 1, 1, 1, 1}), ErrorCode::kInvalidArgument);      // E = 5 for 6 experts
  EXPECT_EQ(code_of({1, -1, 1, 1, 1, 0}), ErrorCode::kInvalidArgument);  // negative
  EXPECT_EQ(min_max_rank_load(std::vector<int64_t>{1, 1, 1, 1, 1, 0}, layout), 2);
}

}  // namespace
}  // namespace cobalt::eval
