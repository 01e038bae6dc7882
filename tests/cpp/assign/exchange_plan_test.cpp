// One rank's exchange plan: by hand on a small case, and on random routings the ranks' plans
// agree with each other (what one rank sends another receives), the rows crossing nodes equal
// Cobalt's metric V, and every task is planned once. Field-for-field equality with the numpy
// reference is python/tests/test_exchange_plan.py.
#include "cobalt/assign/exchange_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "assign/exchange_plan_detail.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::assign {
namespace {

using V = std::vector<int64_t>;

TEST(ExchangePlan, SmallCaseByHand) {
  // 2 nodes x 2 ranks, K = 3. Token 0 (rank 0) runs on ranks 1, 2, 3: intra to 1, and node 1
  // once through rank 2 (rank 0's rail peer there), which forwards to 3. Token 1 (rank 3) runs on
  // 3 (local) and twice on 0: node 0 through rank 1, which forwards to 0.
  const Topology topo(2, 4);
  const std::vector<ExpertId> ids{0, 1, 2, 3, 0, 1};
  const std::vector<RankId> exec{1, 2, 3, 3, 0, 0};
  const std::vector<RankId> src{0, 3};
  const std::vector<ExpertId> slots_of_2{1, kEmptySlot};
  const auto p = exchange_plan(ids, exec, src, 3, topo, slots_of_2, 2);
  EXPECT_EQ(p.num_local_tokens, 0);
  EXPECT_EQ(p.s1_send_splits, (V{0, 0, 0, 0}));
  EXPECT_EQ(p.s1_recv_splits, (V{1, 0, 0, 0}));  // token 0 from rank 0
  EXPECT_EQ(p.s2_send_idx, (V{0}));              // ... forwarded to rank 3
  EXPECT_EQ(p.s2_send_splits, (V{0, 0, 0, 1}));
  EXPECT_EQ(p.table_idx, (V{0}));  // token 0: stage-1 receive row 0
  EXPECT_EQ(p.slot_offsets, (V{0, 1, 1}));
  EXPECT_EQ(p.slot_rows, (V{0}));
  EXPECT_EQ(p.slot_k, (V{1}));
  EXPECT_EQ(p.ca_send_splits, (V{0, 0, 0, 0}));  // the rail peer sums, it sends in stage B
  EXPECT_EQ(p.ca_recv_splits, (V{0, 0, 0, 1}));  // rank 3's partial of token 0
  EXPECT_EQ(p.q_own_dst, (V{0}));
  EXPECT_EQ(p.q_own_src, (V{0}));
  EXPECT_EQ(p.q_recv_dst, (V{0}));
  EXPECT_EQ(p.q_recv_src, (V{0}));
  EXPECT_EQ(p.cb_send_splits, (V{1, 0, 0, 0}));  // one row back to rank 0
  EXPECT_EQ(p.cb_recv_splits, (V{0, 0, 0, 0}));
  EXPECT_EQ(p.num_deliveries, 5);
  EXPECT_EQ(p.num_cross_rows, 2);
  EXPECT_EQ(p.num_intra_rows, 3);  // 0 -> 1, 2 -> 3, 1 -> 0
  EXPECT_EQ(p.num_stage1_rows, 3);
  // Rank 3: token 1 is local, token 0 comes in stage 2.
  const std::vector<ExpertId> slots_of_3{2, 3};
  const auto q = exchange_plan(ids, exec, src, 3, topo, slots_of_3, 3);
  EXPECT_EQ(q.num_local_tokens, 1);
  EXPECT_EQ(q.s1_send_splits, (V{0, 1, 0, 0}));  // token 1 to node 0's rail peer, rank 1
  EXPECT_EQ(q.s1_send_idx, (V{0}));
  EXPECT_EQ(q.s2_recv_splits, (V{0, 0, 1, 0}));
  EXPECT_EQ(q.table_idx, (V{1, 0}));  // token 0 after the local token, token 1 local
  EXPECT_EQ(q.slot_offsets, (V{0, 1, 2}));
  EXPECT_EQ(q.slot_rows, (V{0, 1}));  // expert 2 for token 0, expert 3 for token 1
  EXPECT_EQ(q.ca_send_idx, (V{0}));   // token 0's partial to its rail peer, rank 2
  EXPECT_EQ(q.ca_send_splits, (V{0, 0, 1, 0}));
  EXPECT_EQ(q.y_own_dst, (V{0}));
  EXPECT_EQ(q.y_own_src, (V{1}));
  EXPECT_EQ(q.y_recv_b_dst, (V{0}));  // node 0's sum of token 1, from rank 1
  EXPECT_EQ(q.cb_recv_splits, (V{0, 1, 0, 0}));
}

TEST(ExchangePlan, RanksAgreeAndCrossRowsAreTheMetric) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + static_cast<int>(rng.below(4));
    const Topology topo(nodes, nodes * (1 + static_cast<int>(rng.below(4))));
    const int g = topo.num_ranks(), experts = 2 * g + 3, k = 1 + static_cast<int>(rng.below(5));
    const auto layout = testing::random_layout(seed, topo, experts, (experts + g - 1) / g + 2, 0.8);
    auto owned = testing::random_batch(seed * 7, 50 + static_cast<int64_t>(rng.below(300)), k,
                                       experts, g, 1.0);
    // Tokens ordered by source rank, as the runtime gathers them.
    std::vector<int64_t> order(owned.source_rank.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return owned.source_rank[a] < owned.source_rank[b];
    });
    testing::OwnedBatch sorted = owned;
    for (size_t i = 0; i < order.size(); ++i) {
      sorted.source_rank[i] = owned.source_rank[order[i]];
      std::copy_n(owned.topk_ids.begin() + order[i] * k, k, sorted.topk_ids.begin() + i * k);
    }
    const auto batch = sorted.view();
    std::vector<RankId> exec(batch.num_tasks());
    assign_node_cover(batch, layout, {seed, 0, 0, 0}, {}, exec);
    std::vector<RankExchangePlan> plans;
    for (RankId r = 0; r < g; ++r) {
      plans.push_back(exchange_plan(batch.topk_ids(), exec, batch.source_rank(), k, topo,
                                    layout.slots_of(r), r));
    }
    int64_t tasks = 0, cross_sent = 0;
    for (RankId a = 0; a < g; ++a) {
      const auto& p = plans[a];
      tasks += p.slot_offsets.back();
      EXPECT_EQ(p.num_cross_rows, plans[0].num_cross_rows);
      EXPECT_EQ(p.num_intra_rows, plans[0].num_intra_rows);
      EXPECT_EQ(static_cast<int64_t>(p.s1_send_idx.size()),
                std::accumulate(p.s1_send_splits.begin(), p.s1_send_splits.end(), int64_t{0}));
      for (RankId b = 0; b < g; ++b) {
        EXPECT_EQ(p.s1_send_splits[b], plans[b].s1_recv_splits[a]) << "seed " << seed;
        EXPECT_EQ(p.s2_send_splits[b], plans[b].s2_recv_splits[a]) << "seed " << seed;
        EXPECT_EQ(p.ca_send_splits[b], plans[b].ca_recv_splits[a]) << "seed " << seed;
        EXPECT_EQ(p.cb_send_splits[b], plans[b].cb_recv_splits[a]) << "seed " << seed;
        if (topo.node_of(a) != topo.node_of(b)) {
          cross_sent += p.s1_send_splits[b];
          EXPECT_EQ(p.s2_send_splits[b], 0);  // stage 2 and stage A stay inside a node
          EXPECT_EQ(p.ca_send_splits[b], 0);
        } else {
          EXPECT_EQ(p.cb_send_splits[b], 0);  // stage B crosses nodes only
        }
      }
    }
    EXPECT_EQ(tasks, batch.num_tasks()) << "seed " << seed;
    EXPECT_EQ(cross_sent, plans[0].num_cross_rows);
    EXPECT_EQ(cross_sent, eval::cross_node_transfers(batch, exec, topo).dedup) << "seed " << seed;
  }
}

// The rank-mask path (G <= 64, what exchange_plan runs there) against the insertion-sort path on
// random clusters up to 64 ranks (8 x 8 and 1 x 64 included), routings with repeated ranks per
// token, every rank's plan.
TEST(ExchangePlan, RankMasksMakeTheSamePlanAsTheSortedRanks) {
  int64_t num_compared = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed * 131);
    int nodes = 1 + static_cast<int>(rng.below(8)), per_node = 1 + static_cast<int>(rng.below(8));
    if (seed == 1) nodes = 8, per_node = 8;
    if (seed == 2) nodes = 1, per_node = 64;
    if (seed == 3) nodes = 64, per_node = 1;
    const Topology topo(nodes, nodes * per_node);
    const int g = topo.num_ranks(), k = 1 + static_cast<int>(rng.below(8));
    const int64_t tokens = static_cast<int64_t>(rng.below(200));
    std::vector<RankId> src(tokens), exec(tokens * k);
    std::vector<ExpertId> ids(tokens * k);
    for (int64_t t = 0; t < tokens; ++t) src[t] = static_cast<RankId>(rng.below(g));
    std::sort(src.begin(), src.end());
    // Experts e on rank e % g (slot e / g): a rank holds every expert it executes.
    const int experts = 2 * g;
    for (int64_t i = 0; i < tokens * k; ++i) {
      ids[i] = static_cast<ExpertId>(rng.below(experts));
      exec[i] = ids[i] % g;
    }
    for (RankId r = 0; r < g; ++r) {
      const std::vector<ExpertId> slots{r, r + g};
      const auto masked =
          detail::exchange_plan_impl(ids, exec, src, k, topo, slots, r, /*use_rank_masks=*/true);
      const auto sorted =
          detail::exchange_plan_impl(ids, exec, src, k, topo, slots, r, /*use_rank_masks=*/false);
      ASSERT_TRUE(masked == sorted) << "seed " << seed << " rank " << r;
      ASSERT_TRUE(exchange_plan(ids, exec, src, k, topo, slots, r) == masked);
      ++num_compared;
    }
  }
  EXPECT_GT(num_compared, 600);
  // Masks need G <= 64.
  const Topology big(2, 66);
  EXPECT_THROW(detail::exchange_plan_impl({}, {}, {}, 1, big, std::vector<ExpertId>{0}, 0, true),
               Error);
}

TEST(ExchangePlan, RejectsBadRouting) {
  const Topology topo(2, 4);
  const std::vector<ExpertId> ids{0, 1, 2, 3};
  const std::vector<RankId> exec{0, 1, 2, 3};
  const std::vector<ExpertId> slots{0, 1};
  auto code_of = [&](std::vector<RankId> src, std::vector<RankId> ex, std::vector<ExpertId> sl,
                     RankId rank) {
    try {
      exchange_plan(ids, ex, src, 2, topo, sl, rank);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of({1, 0}, exec, slots, 0), ErrorCode::kInvalidArgument);  // sources decrease
  EXPECT_EQ(code_of({0, 1}, {0, 4, 2, 3}, slots, 0), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({0, 1}, exec, slots, -1), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({0, 1}, exec, {2, 3}, 0), ErrorCode::kInvalidArgument);   // 0 not held
  EXPECT_EQ(code_of({0, 1}, exec, {0, 0}, 0), ErrorCode::kInvalidArgument);   // held twice
  EXPECT_EQ(code_of({0}, exec, slots, 0), ErrorCode::kInvalidArgument);       // sizes
  EXPECT_EQ(code_of({0, 1}, exec, {0, -5}, 0), ErrorCode::kInvalidArgument);  // not an id
  // A huge expert id in a slot is only an id this rank does not execute (no table sized by it).
  EXPECT_EQ(code_of({0, 1}, exec, {2147483647, 1}, 0), ErrorCode::kInvalidArgument);
  EXPECT_NO_THROW(
      exchange_plan(ids, exec, std::vector<RankId>{0, 1}, 2, topo, {{0, 2147483647}}, 0));
  EXPECT_NO_THROW(exchange_plan(ids, exec, std::vector<RankId>{0, 1}, 2, topo, slots, 0));
}

}  // namespace
}  // namespace cobalt::assign
