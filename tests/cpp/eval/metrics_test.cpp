#include "cobalt/eval/metrics.hpp"

#include <gtest/gtest.h>

#include <set>

#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

TEST(Metrics, HandComputedFixture) {
  // 3 nodes x 2 ranks (node n = ranks 2n, 2n+1). K = 3.
  // token 0 from rank 0 (node 0): exec ranks {1, 2, 3} -> nodes {0, 1, 1}: remote {1} -> V += 1;
  //                                no-dedup: ranks 2 and 3 are remote -> 2.
  // token 1 from rank 5 (node 2): exec ranks {0, 2, 4} -> nodes {0, 1, 2}: remote {0, 1} -> V += 2;
  //                                no-dedup 2.
  // token 2 from rank 3 (node 1): exec ranks {2, 3, 2} -> all node 1 -> V += 0, no-dedup 0.
  Topology topo(3, 6);
  std::vector<ExpertId> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<RankId> src = {0, 5, 3};
  RoutingBatch batch(ids, src, 3, 9, 6);
  std::vector<RankId> exec = {1, 2, 3, 0, 2, 4, 2, 3, 2};
  auto v = cross_node_transfers(batch, exec, topo);
  EXPECT_EQ(v.dedup, 3);
  EXPECT_EQ(v.no_dedup, 4);
  // Loads: rank0 1, rank1 1, rank2 4, rank3 2, rank4 1, rank5 0 -> mean 9/6 = 1.5, max 4 -> 2.6667.
  auto loads = rank_loads(exec, 6);
  EXPECT_EQ(loads, (std::vector<int64_t>{1, 1, 4, 2, 1, 0}));
  EXPECT_NEAR(imbalance(loads), 4 / 1.5, 1e-12);
  // Expert counts all 1 -> MaxVio 0.
  auto m = step_metrics(batch, exec, topo);
  EXPECT_DOUBLE_EQ(m.max_violation, 0.0);
  // MaxVio of (3, 1, 0, 0): mean 1, max 3 -> 2.
  std::vector<int64_t> counts = {3, 1, 0, 0};
  EXPECT_DOUBLE_EQ(max_violation(counts), 2.0);
  EXPECT_DOUBLE_EQ(imbalance(std::vector<int64_t>{0, 0}), 1.0);
  EXPECT_DOUBLE_EQ(token_bytes(3, 4096, 2), 3.0 * 4096 * 2);
}

TEST(Metrics, CrossNodeMatchesSetReferenceOnRandomInputs) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + rng.below(8), per_node = 1 + rng.below(4), top_k = 1 + rng.below(6);
    Topology topo(nodes, nodes * per_node);
    auto owned = testing::random_batch(seed, 500, top_k, 16, topo.num_ranks());
    auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    for (auto& r : exec) r = static_cast<RankId>(rng.below(topo.num_ranks()));
    int64_t ref_dedup = 0, ref_no_dedup = 0;
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      std::set<NodeId> remote;
      const NodeId src = topo.node_of(batch.source_of(t));
      for (int k = 0; k < top_k; ++k) {
        const NodeId n = topo.node_of(exec[t * top_k + k]);
        if (n != src) {
          remote.insert(n);
          ++ref_no_dedup;
        }
      }
      ref_dedup += static_cast<int64_t>(remote.size());
    }
    auto v = cross_node_transfers(batch, exec, topo);
    EXPECT_EQ(v.dedup, ref_dedup);
    EXPECT_EQ(v.no_dedup, ref_no_dedup);
    auto loads = rank_loads(exec, topo.num_ranks());
    int64_t sum = 0;
    for (auto l : loads) sum += l;
    EXPECT_EQ(sum, batch.num_tasks());
  }
}

}  // namespace
}  // namespace cobalt::eval
