#include "cobalt/plan/laer_planner.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::plan {
namespace {

TEST(LaerPlanner, SpreadPlacementFillsTheEmptiestNodesFirst) {
  // 2 nodes x 2 ranks, 2 slots. Expert 0: 3 replicas of 10, expert 1: one of 5.
  // e0#1 -> rank 0; e0#2: node 1 has none -> rank 2; e0#3: both nodes have one -> least loaded
  // rank lacking e0 -> rank 1; e1 -> the only idle rank, 3.
  const Topology topo(2, 4);
  const auto layout =
      laer_spread_placement(topo, 2, 2, std::vector<int>{3, 1}, std::vector<double>{30, 5});
  EXPECT_TRUE(layout.holds(0, 0));
  EXPECT_TRUE(layout.holds(2, 0));
  EXPECT_TRUE(layout.holds(1, 0));
  EXPECT_TRUE(layout.holds(3, 1));
  EXPECT_EQ(layout.num_replicas(), 4);
}

TEST(LaerPlanner, ModelledTimeHandChecked) {
  // 2 nodes of one rank; expert 0 on rank 0 only. Rank 0 sends 10 tasks (local), rank 1 sends 6
  // across nodes. comm = 6 * 100 B / 10 B/s = 60 s; comp on rank 0 = 16 tasks * 2 s.
  // time = 4 * 60 + 4 * 32 = 368 (global checkpoint: 4 compute passes).
  const auto layout = ExpertLayout::from_rank_lists(Topology(2, 2), 1, 1, {{0}, {}});
  LaerOptions o;
  o.cost.token_bytes = 100;
  o.cost.net_bytes_per_s = 10;
  o.cost.nvlink_bytes_per_s = 1000;
  o.cost.expert_param_bytes = 2;  // 2 FLOPs per token
  o.cost.gemm_flops_per_s = 1;
  EXPECT_DOUBLE_EQ(laer_modelled_time(layout, std::vector<double>{10, 6}, o), 368.0);
  o.global_checkpoint = false;
  EXPECT_DOUBLE_EQ(laer_modelled_time(layout, std::vector<double>{10, 6}, o), 336.0);
}

TEST(LaerPlanner, OneReplicaPerNodeFirstThenByLoad) {
  // 2 nodes x 2 ranks, 4 experts, 2 slots: 8 slots = 2 per expert -> one on each node.
  const Topology topo(2, 4);
  std::vector<double> demand(4 * 4, 1.0);
  demand[0] = 100;
  const auto plan = plan_laer(topo, 4, 2, demand, {});
  for (ExpertId e = 0; e < 4; ++e) {
    EXPECT_EQ(plan.layout.ranks_of(e, 0).size(), 1u) << e;
    EXPECT_EQ(plan.layout.ranks_of(e, 1).size(), 1u) << e;
  }
  // 3 experts, 8 slots (not a multiple of 3: no uniform candidate). Each starts with one replica
  // per node (6 used); the hot expert takes the next node's worth: 4 replicas, one on every rank.
  std::vector<double> demand3(4 * 3, 1.0);
  demand3[0] = 100;
  const auto hot = plan_laer(topo, 3, 2, demand3, {});
  EXPECT_EQ(hot.num_candidates, 1);
  EXPECT_EQ(hot.replica_counts, (std::vector<int>{4, 2, 2}));
  EXPECT_EQ(hot.layout.num_replicas_of(0), 4);
}

TEST(LaerPlanner, ValidAndDeterministicOnRandomDemand) {
  const Topology topo(4, 16);
  SplitMix64 rng(9);
  for (int trial = 0; trial < 10; ++trial) {
    const int num_experts = 8 + static_cast<int>(rng.below(40));
    const int slots = (num_experts + 15) / 16 + static_cast<int>(rng.below(3));
    std::vector<double> demand(16 * num_experts);
    for (auto& d : demand) d = std::floor(50 * std::pow(rng.unit(), 3));
    LaerOptions o;
    o.num_perturbations = 3;
    o.seed = trial;
    const auto a = plan_laer(topo, num_experts, slots, demand, o);
    const auto b = plan_laer(topo, num_experts, slots, demand, o);
    EXPECT_EQ(a.layout, b.layout);
    EXPECT_GE(a.num_candidates, 1);
    for (ExpertId e = 0; e < num_experts; ++e) EXPECT_GE(a.layout.num_replicas_of(e), 1);
  }
  EXPECT_THROW(plan_laer(topo, 4, 1, std::vector<double>(3), {}), Error);
}

}  // namespace
}  // namespace cobalt::plan
