#include "cobalt/plan/replica_routing.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::plan {
namespace {

// 2 nodes x 2 ranks; expert 0 on ranks 1, 2, 3; expert 1 on rank 0.
ExpertLayout hand_layout() {
  return ExpertLayout::from_rank_lists(Topology(2, 4), 2, 2, {{1}, {0}, {0}, {0}});
}

std::vector<int64_t> demand_from(RankId src, int64_t tasks_of_expert0) {
  std::vector<int64_t> counts(4 * 2, 0);
  counts[src * 2 + 0] = tasks_of_expert0;
  return counts;
}

std::vector<int64_t> loads(const std::vector<int64_t>& counts, ReplicaScope scope) {
  std::vector<int64_t> out(4);
  route_counts(counts, hand_layout(), scope, out);
  return out;
}

TEST(ReplicaRouting, EvenSplitByScopeHandChecked) {
  // Source rank 0 (node 0) sends 5 tasks of expert 0. Candidates for all replicas: ranks 1, 2, 3;
  // 5 = 3 + 2: the first two after rotating by the source (rank 0: no rotation) get one more.
  EXPECT_EQ(loads(demand_from(0, 5), ReplicaScope::kAllReplicas),
            (std::vector<int64_t>{0, 2, 2, 1}));
  // Node 0 holds expert 0 on rank 1 only: everything stays on node 0.
  EXPECT_EQ(loads(demand_from(0, 5), ReplicaScope::kSameNodeFirst),
            (std::vector<int64_t>{0, 5, 0, 0}));
  // Rank 0 does not hold expert 0: all replicas.
  EXPECT_EQ(loads(demand_from(0, 5), ReplicaScope::kSourceRankFirst),
            (std::vector<int64_t>{0, 2, 2, 1}));
  // Source rank 3 holds expert 0 itself.
  EXPECT_EQ(loads(demand_from(3, 5), ReplicaScope::kSourceRankFirst),
            (std::vector<int64_t>{0, 0, 0, 5}));
  // Source rank 3 (node 1): candidates 2 and 3; 5 = 2 x 2 + 1, the extra one rotated by 3 lands on
  // candidate (0 + 3) mod 2 = 1, i.e. rank 3.
  EXPECT_EQ(loads(demand_from(3, 5), ReplicaScope::kSameNodeFirst),
            (std::vector<int64_t>{0, 0, 2, 3}));
}

TEST(ReplicaRouting, SparseDemandSpreadsOverReplicas) {
  // One task of expert 0 from each of the four sources: every holder gets at least one.
  std::vector<int64_t> counts(4 * 2, 0);
  for (int src = 0; src < 4; ++src) counts[src * 2] = 1;
  const auto out = loads(counts, ReplicaScope::kAllReplicas);
  EXPECT_EQ(out[0], 0);
  for (int r = 1; r < 4; ++r) EXPECT_GE(out[r], 1) << "rank " << r;
}

TEST(ReplicaRouting, TokensAndCountsAgreeAndRespectScopes) {
  const Topology topo(2, 8);
  const auto layout = testing::random_layout(5, topo, 24, 4, 0.9);
  const auto owned = testing::random_batch(6, 3000, 4, 24, 8, 1.0);
  const auto batch = owned.view();
  const auto counts = count_demand(batch);
  int64_t total = 0;
  for (auto c : counts) total += c;
  EXPECT_EQ(total, batch.num_tasks());
  for (auto scope :
       {ReplicaScope::kAllReplicas, ReplicaScope::kSameNodeFirst, ReplicaScope::kSourceRankFirst}) {
    std::vector<RankId> exec(batch.num_tasks());
    route_tokens(batch, layout, scope, exec);
    std::vector<int64_t> from_tokens(topo.num_ranks(), 0), from_counts(topo.num_ranks());
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      const RankId src = batch.source_of(t);
      for (int k = 0; k < batch.top_k(); ++k) {
        const ExpertId e = batch.experts_of(t)[k];
        const RankId r = exec[t * batch.top_k() + k];
        ASSERT_TRUE(layout.holds(r, e));
        ++from_tokens[r];
        if (scope == ReplicaScope::kSameNodeFirst &&
            !layout.ranks_of(e, topo.node_of(src)).empty()) {
          EXPECT_EQ(topo.node_of(r), topo.node_of(src));
        }
        if (scope == ReplicaScope::kSourceRankFirst && layout.holds(src, e)) EXPECT_EQ(r, src);
      }
    }
    route_counts(counts, layout, scope, from_counts);
    EXPECT_EQ(from_tokens, from_counts) << "scope " << static_cast<int>(scope);
    // The fractional version splits exactly; integer loads are within one task per (s, e).
    const auto expected =
        expected_rank_loads(std::vector<double>(counts.begin(), counts.end()), layout, scope);
    double sum = 0;
    for (double v : expected) sum += v;
    EXPECT_NEAR(sum, static_cast<double>(batch.num_tasks()), 1e-6);
  }
}

// route_tokens against the header's definition computed directly (the c-th task of (s, e) on
// candidate (c + s) mod L), on random layouts and batches, every scope. Both of its paths: a
// [G, E] table when G E <= T K, tokens grouped by source otherwise (odd seeds draw up to 8
// tokens, even ones up to 500).
TEST(ReplicaRouting, TokensFollowTheDefinition) {
  int num_grouped = 0, num_table = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SplitMix64 rng(seed * 17);
    const int nodes = 1 + static_cast<int>(rng.below(4)),
              per_node = 1 + static_cast<int>(rng.below(5));
    const Topology topo(nodes, nodes * per_node);
    const int slots = 1 + static_cast<int>(rng.below(4));
    const int experts = 1 + static_cast<int>(rng.below(topo.num_ranks() * slots));
    const auto layout = testing::random_layout(seed, topo, experts, slots, rng.unit());
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 4)));
    const auto owned =
        testing::random_batch(seed * 3, static_cast<int64_t>(rng.below(seed % 2 ? 9 : 500)), top_k,
                              experts, topo.num_ranks(), 1.5);
    const auto batch = owned.view();
    (static_cast<int64_t>(topo.num_ranks()) * experts <= batch.num_tasks() ? num_table
                                                                           : num_grouped) += 1;
    for (auto scope : {ReplicaScope::kAllReplicas, ReplicaScope::kSameNodeFirst,
                       ReplicaScope::kSourceRankFirst}) {
      std::vector<RankId> exec(batch.num_tasks()), want(batch.num_tasks());
      route_tokens(batch, layout, scope, exec);
      std::vector<int64_t> seen(static_cast<size_t>(topo.num_ranks()) * experts, 0);
      for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
        const RankId s = batch.source_of(t);
        for (int k = 0; k < top_k; ++k) {
          const ExpertId e = batch.experts_of(t)[k];
          std::vector<RankId> cand(layout.ranks_of(e).begin(), layout.ranks_of(e).end());
          const auto local = layout.ranks_of(e, topo.node_of(s));
          if (scope == ReplicaScope::kSameNodeFirst && !local.empty()) {
            cand.assign(local.begin(), local.end());
          }
          if (scope == ReplicaScope::kSourceRankFirst && layout.holds(s, e)) cand = {s};
          const int64_t c = seen[static_cast<size_t>(s) * experts + e]++;
          want[t * top_k + k] = cand[(c + s) % static_cast<int64_t>(cand.size())];
        }
      }
      EXPECT_EQ(exec, want) << "seed " << seed << " scope " << static_cast<int>(scope);
    }
  }
  EXPECT_GE(num_table, 5);
  EXPECT_GE(num_grouped, 5);
}

TEST(ReplicaRouting, ExpectedFlowsSplitFractionally) {
  std::vector<double> demand(4 * 2, 0.0);
  demand[0 * 2 + 0] = 3.0;  // rank 0 -> expert 0 (ranks 1, 2, 3)
  demand[2 * 2 + 1] = 2.0;  // rank 2 -> expert 1 (rank 0)
  const auto flows = expected_flows(demand, hand_layout(), ReplicaScope::kAllReplicas);
  EXPECT_DOUBLE_EQ(flows[0 * 4 + 1], 1.0);
  EXPECT_DOUBLE_EQ(flows[0 * 4 + 2], 1.0);
  EXPECT_DOUBLE_EQ(flows[0 * 4 + 3], 1.0);
  EXPECT_DOUBLE_EQ(flows[2 * 4 + 0], 2.0);
  EXPECT_EQ(expert_loads_of(demand, 2), (std::vector<double>{3.0, 2.0}));
}

TEST(ReplicaRouting, RejectsMismatchedShapes) {
  std::vector<int64_t> counts(5, 0), out(4);
  EXPECT_THROW(route_counts(counts, hand_layout(), ReplicaScope::kAllReplicas, out), Error);
}

// route_counts with three candidates from a source that is not a multiple of 3: the c-th task
// of (s, e) runs on candidate (c + s) mod L, so 4 tasks from rank 1 over ranks 1, 2, 3 put the
// extra one on candidate 1 (rank 2).
TEST(RouteCounts, CountsRotateByTheSourceWithThreeCandidates) {
  const auto layout = ExpertLayout::from_rank_lists(Topology(2, 4), 2, 2, {{1}, {0}, {0}, {0}});
  std::vector<int64_t> counts(4 * 2, 0);
  counts[1 * 2 + 0] = 4;
  std::vector<int64_t> out(4);
  route_counts(counts, layout, ReplicaScope::kAllReplicas, out);
  EXPECT_EQ(out, (std::vector<int64_t>{0, 1, 2, 1}));
}

}  // namespace
}  // namespace cobalt::plan
