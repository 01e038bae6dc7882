#include "cobalt/assign/balanced_cover.hpp"

#include <gtest/gtest.h>

#include <bit>

#include "cobalt/core/assignment.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::assign {
namespace {

TEST(BalancedCover, SameCrossNodeTransfersAsAlgorithmOneAndNoWorseBalance) {
  double sum_balanced = 0, sum_uniform = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 2 + static_cast<int>(rng.below(4)),
              per_node = 2 + static_cast<int>(rng.below(3));
    Topology topo(nodes, nodes * per_node);
    const int experts = 4 * topo.num_ranks();
    auto layout = testing::random_layout(seed, topo, experts, 6, 0.8);
    auto owned = testing::random_batch(seed * 3, 3000, 4, experts, topo.num_ranks(), 1.0);
    auto batch = owned.view();
    std::vector<RankId> balanced(batch.num_tasks()), uniform(batch.num_tasks());
    assign_balanced_cover(batch, layout, {CoverSearch::kAuto, 1}, balanced);
    assign_node_cover(batch, layout, {seed, 0, 0, 0}, {CoverSearch::kAuto, 1}, uniform);
    validate_assignment(batch, layout, balanced);
    // Every token reaches exactly its cover: V equals the sum of cover sizes, as for Algorithm 1.
    std::vector<uint64_t> covers(batch.num_tokens());
    remote_node_covers(batch, layout, {}, covers);
    int64_t cover_total = 0;
    for (uint64_t c : covers) cover_total += std::popcount(c);
    EXPECT_EQ(eval::cross_node_transfers(batch, balanced, topo).dedup, cover_total);
    EXPECT_EQ(eval::cross_node_transfers(batch, uniform, topo).dedup, cover_total);
    sum_balanced += eval::imbalance(eval::rank_loads(balanced, topo.num_ranks()));
    sum_uniform += eval::imbalance(eval::rank_loads(uniform, topo.num_ranks()));
    // Deterministic and thread-independent.
    std::vector<RankId> again(batch.num_tasks());
    assign_balanced_cover(batch, layout, {CoverSearch::kAuto, 4}, again);
    EXPECT_EQ(balanced, again);
  }
  EXPECT_LT(sum_balanced, sum_uniform);
}

TEST(BalancedCover, WaterFillsReplicasOfOneExpert) {
  // Expert 0 on all 4 ranks of one node, 10 tokens from that node: quotas 3,3,2,2.
  Topology topo(1, 4);
  ExpertLayout layout(topo, 1, 1, {0, 0, 0, 0});
  std::vector<ExpertId> ids(10, 0);
  std::vector<RankId> src(10, 0);
  RoutingBatch batch(ids, src, 1, 1, 4);
  std::vector<RankId> exec(10);
  assign_balanced_cover(batch, layout, {}, exec);
  EXPECT_EQ(exec, (std::vector<RankId>{0, 0, 0, 1, 1, 1, 2, 2, 3, 3}));
}

}  // namespace
}  // namespace cobalt::assign

namespace cobalt::assign {
namespace {

TEST(BalancedCover, SpillTradesCrossNodeCopiesForBalance) {
  // 2 nodes x 1 rank. Expert 0 on both ranks, expert 1 only on rank 0. 10 tokens from node 0 pick
  // {0, 1}: without spill everything runs on rank 0 (20 tasks vs 0). With spill (cap = ceil(1.0 *
  // 10)), expert 0's tasks move to rank 1, costing one cross-node copy per moved token.
  Topology topo(2, 2);
  ExpertLayout layout(topo, 2, 2, {0, 1, 0, -1});
  std::vector<ExpertId> ids;
  for (int t = 0; t < 10; ++t) ids.insert(ids.end(), {0, 1});
  std::vector<RankId> src(10, 0);
  RoutingBatch batch(ids, src, 2, 2, 2);
  std::vector<RankId> plain(20), spilled(20);
  assign_balanced_cover(batch, layout, {}, plain);
  assign_balanced_cover(batch, layout, {}, spilled, 0.0);
  EXPECT_EQ(eval::rank_loads(plain, 2), (std::vector<int64_t>{20, 0}));
  EXPECT_EQ(eval::rank_loads(spilled, 2), (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(eval::cross_node_transfers(batch, plain, topo).dedup, 0);
  EXPECT_EQ(eval::cross_node_transfers(batch, spilled, topo).dedup, 10);
  validate_assignment(batch, layout, spilled);
}

}  // namespace
}  // namespace cobalt::assign
