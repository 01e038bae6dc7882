#include "cobalt/assign/balanced_cover.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/core/assignment.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/optimal_max_load.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::assign {
namespace {

// assign_balanced_cover without the spill, written plainly from its header's description: tasks
// grouped by (expert, allowed nodes) in a map, classes in order of (allowed ranks, -count,
// expert, mask), each class's tasks given one at a time to the allowed rank with the least load
// (ties: the lower load before this class, then the lower id; the integer water-filling's quotas),
// then the class's tasks, in token order, take its quotas by ascending rank.
std::vector<RankId> balanced_cover_reference(const RoutingBatch& batch,
                                             const ExpertLayout& layout) {
  std::vector<uint64_t> covers(batch.num_tokens());
  remote_node_covers(batch, layout, {}, {}, covers);
  const int per_node = layout.topology().ranks_per_node();
  const auto allowed_of = [&](TokenIdx t, ExpertId e) {
    return (covers[t] | uint64_t{1} << (batch.source_of(t) / per_node)) & layout.node_mask(e);
  };
  struct Class {
    int64_t count = 0;
    std::vector<RankId> ranks;        // allowed, ascending
    std::map<RankId, int64_t> quota;  // rank -> tasks
  };
  std::map<std::pair<ExpertId, uint64_t>, Class> classes;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    for (ExpertId e : batch.experts_of(t)) ++classes[{e, allowed_of(t, e)}].count;
  }
  std::vector<std::pair<std::pair<ExpertId, uint64_t>, Class*>> order;
  for (auto& [key, cls] : classes) {
    for (RankId r : layout.ranks_of(key.first)) {
      if ((key.second >> (r / per_node)) & 1) cls.ranks.push_back(r);
    }
    order.emplace_back(key, &cls);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.second->ranks.size(), -a.second->count, a.first) <
           std::make_tuple(b.second->ranks.size(), -b.second->count, b.first);
  });
  std::vector<int64_t> load(layout.num_ranks(), 0);
  for (auto& [key, cls] : order) {
    const std::vector<int64_t> before = load;
    for (int64_t n = 0; n < cls->count; ++n) {
      const RankId r =
          *std::min_element(cls->ranks.begin(), cls->ranks.end(), [&](RankId a, RankId b) {
            return std::make_tuple(load[a], before[a], a) < std::make_tuple(load[b], before[b], b);
          });
      ++load[r];
      ++cls->quota[r];
    }
  }
  std::vector<RankId> exec(batch.num_tasks());
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    for (int k = 0; k < batch.top_k(); ++k) {
      const ExpertId e = batch.experts_of(t)[k];
      auto& quota = classes[{e, allowed_of(t, e)}].quota;
      auto first = quota.begin();
      while (first->second == 0) ++first;
      exec[t * batch.top_k() + k] = first->first;
      --first->second;
    }
  }
  return exec;
}

TEST(BalancedCover, SpillReachesTheOptimumAboveTheCapOnSmallInstances) {
  // Random small clusters, layouts and skewed batches: with spill the maximum load is exactly
  // max(cap, the brute-force optimum on the layout), whatever the cap.
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SplitMix64 rng(seed * 7919);
    const int nodes = 1 + static_cast<int>(rng.below(3)),
              per_node = 1 + static_cast<int>(rng.below(3));
    Topology topo(nodes, nodes * per_node);
    const int slots = 1 + static_cast<int>(rng.below(3));
    const int experts = std::max(1, static_cast<int>(rng.below(topo.num_ranks() * slots)) + 1);
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 3)));
    auto layout = testing::random_layout(seed, topo, experts, slots, 0.6);
    auto owned = testing::random_batch(seed * 5, 1 + static_cast<int64_t>(rng.below(40)), top_k,
                                       experts, topo.num_ranks(), 2.0);
    auto batch = owned.view();
    const int64_t optimum = testing::optimal_max_load(batch, layout);
    for (double tolerance : {0.0, 0.05, 0.3}) {
      std::vector<RankId> plain(batch.num_tasks()), spilled(batch.num_tasks());
      assign_balanced_cover(batch, layout, {}, {}, plain);
      assign_balanced_cover(batch, layout, {}, {}, spilled, tolerance);
      validate_assignment(batch, layout, spilled);
      const auto plain_loads = eval::rank_loads(plain, topo.num_ranks());
      const auto loads = eval::rank_loads(spilled, topo.num_ranks());
      const int64_t cap = balance_cap(batch.num_tasks(), topo.num_ranks(), tolerance);
      const int64_t plain_max = *std::max_element(plain_loads.begin(), plain_loads.end());
      const int64_t max_load = *std::max_element(loads.begin(), loads.end());
      EXPECT_EQ(max_load, std::min(plain_max, std::max(cap, optimum)))
          << "seed " << seed << " tolerance " << tolerance << " cap " << cap << " optimum "
          << optimum << " without spill " << plain_max;
      // Same result again (deterministic).
      std::vector<RankId> again(batch.num_tasks());
      assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 3}, again, tolerance);
      EXPECT_EQ(again, spilled);
    }
  }
}

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
    assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 1}, balanced);
    assign_node_cover(batch, layout, {seed, 0, 0, 0}, {CoverSearch::kAuto, 1}, uniform);
    validate_assignment(batch, layout, balanced);
    // Every token reaches exactly its cover: V equals the sum of cover sizes, as for Algorithm 1.
    std::vector<uint64_t> covers(batch.num_tokens());
    remote_node_covers(batch, layout, {}, {}, covers);
    int64_t cover_total = 0;
    for (uint64_t c : covers) cover_total += std::popcount(c);
    EXPECT_EQ(eval::cross_node_transfers(batch, balanced, topo).dedup, cover_total);
    EXPECT_EQ(eval::cross_node_transfers(batch, uniform, topo).dedup, cover_total);
    sum_balanced += eval::imbalance(eval::rank_loads(balanced, topo.num_ranks()));
    sum_uniform += eval::imbalance(eval::rank_loads(uniform, topo.num_ranks()));
    // Deterministic and thread-independent.
    std::vector<RankId> again(batch.num_tasks());
    assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 4}, again);
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
  assign_balanced_cover(batch, layout, {}, {}, exec);
  EXPECT_EQ(exec, (std::vector<RankId>{0, 0, 0, 1, 1, 1, 2, 2, 3, 3}));
}

// The header's tie rule, hand-checked: experts 0 and 1 on both ranks of one node, tokens
// [0], [0], [0], [1], [1]. Class 0 (3 tasks) gives loads [2, 1]. Class 1 (2 tasks) raises rank 1
// to 2, and the last task goes to rank 1, least loaded before the class (loads [2, 3]), not to
// rank 0, the lowest id of the ranks tied at 2.
TEST(BalancedCover, AnUnevenLastLevelFavoursTheRanksLeastLoadedBeforeTheClass) {
  Topology topo(1, 2);
  ExpertLayout layout(topo, 2, 2, {0, 1, 0, 1});
  std::vector<ExpertId> ids{0, 0, 0, 1, 1};
  std::vector<RankId> src(5, 0);
  RoutingBatch batch(ids, src, 1, 2, 2);
  std::vector<RankId> exec(5);
  assign_balanced_cover(batch, layout, {}, {}, exec);
  EXPECT_EQ(exec, (std::vector<RankId>{0, 0, 1, 1, 1}));
}

}  // namespace
}  // namespace cobalt::assign

namespace cobalt::assign {
namespace {

TEST(BalancedCover, SpillTradesCrossNodeCopiesForBalance) {
  // 2 nodes x 1 rank. Expert 0 on both ranks, expert 1 only on rank 0. 10 tokens from node 0 pick
  // {0, 1}: without spill everything runs on rank 0 (20 tasks vs 0). With spill (cap = 1.0 * 10),
  // expert 0's tasks move to rank 1, costing one cross-node copy per moved token.
  Topology topo(2, 2);
  ExpertLayout layout(topo, 2, 2, {0, 1, 0, -1});
  std::vector<ExpertId> ids;
  for (int t = 0; t < 10; ++t) ids.insert(ids.end(), {0, 1});
  std::vector<RankId> src(10, 0);
  RoutingBatch batch(ids, src, 2, 2, 2);
  std::vector<RankId> plain(20), spilled(20);
  assign_balanced_cover(batch, layout, {}, {}, plain);
  assign_balanced_cover(batch, layout, {}, {}, spilled, 0.0);
  EXPECT_EQ(eval::rank_loads(plain, 2), (std::vector<int64_t>{20, 0}));
  EXPECT_EQ(eval::rank_loads(spilled, 2), (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(eval::cross_node_transfers(batch, plain, topo).dedup, 0);
  EXPECT_EQ(eval::cross_node_transfers(batch, spilled, topo).dedup, 10);
  validate_assignment(batch, layout, spilled);
  // A cap at or above every task (a huge, infinite or NaN tolerance) spills nothing.
  for (double tolerance :
       {1e300, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    assign_balanced_cover(batch, layout, {}, {}, spilled, tolerance);
    EXPECT_EQ(spilled, plain) << tolerance;
  }
}

TEST(BalancedCover, SpillFollowsChainsOfHolders) {
  // 3 nodes x 1 rank. Expert 0 on ranks 0 and 1, expert 1 on ranks 1 and 2. Six tokens from node 0
  // pick expert 0, three from node 1 pick expert 1: loads 6, 3, 0 without spill. With cap 3 a
  // one-hop move of expert 0 to rank 1 would put rank 1 above the cap; the chain
  // 0 -(expert 0)-> 1 -(expert 1)-> 2 levels every rank, at one cross-node copy per moved task.
  Topology topo(3, 3);
  ExpertLayout layout(topo, 2, 2, {0, -1, 0, 1, 1, -1});
  std::vector<ExpertId> ids{0, 0, 0, 0, 0, 0, 1, 1, 1};
  std::vector<RankId> src{0, 0, 0, 0, 0, 0, 1, 1, 1};
  RoutingBatch batch(ids, src, 1, 2, 3);
  std::vector<RankId> plain(9), spilled(9);
  assign_balanced_cover(batch, layout, {}, {}, plain);
  assign_balanced_cover(batch, layout, {}, {}, spilled, 0.0);
  EXPECT_EQ(plain, (std::vector<RankId>{0, 0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(spilled, (std::vector<RankId>{1, 1, 1, 0, 0, 0, 2, 2, 2}));
  EXPECT_EQ(eval::cross_node_transfers(batch, spilled, topo).dedup, 6);
}

TEST(BalancedCover, QuotasAreTakenInTokenOrderAcrossChunks) {
  // One expert on both ranks of one node, 40000 tokens (4 token chunks): quotas 20000 + 20000, so
  // the first half of the tokens runs on rank 0 and the second half on rank 1, whatever the chunks.
  Topology topo(1, 2);
  ExpertLayout layout(topo, 1, 1, {0, 0});
  const int64_t num_tokens = 40000;
  std::vector<ExpertId> ids(num_tokens, 0);
  std::vector<RankId> src(num_tokens, 0);
  RoutingBatch batch(ids, src, 1, 1, 2);
  std::vector<RankId> expected(num_tokens, 0);
  std::fill(expected.begin() + num_tokens / 2, expected.end(), 1);
  for (int threads : {1, 2, 3}) {
    std::vector<RankId> exec(num_tokens);
    assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, threads}, exec);
    EXPECT_EQ(exec, expected) << threads << " threads";
  }
}

// A random layout and batch for the reference comparisons: nodes in [min_nodes, min_nodes +
// node_choices), 1 to max_per_node ranks each, 2 to 1 + slot_choices slots per rank, K up to
// max_top_k, 1 to max_tokens tokens; the layout's replica fill in [min_fill, 1).
struct RandomCase {
  int nodes;
  ExpertLayout layout;
  testing::OwnedBatch owned;
};
RandomCase random_case(uint64_t seed, SplitMix64& rng, int min_nodes, int node_choices,
                       int max_per_node, int slot_choices, int max_top_k, int64_t max_tokens,
                       double min_fill, double skew) {
  const int nodes = min_nodes + static_cast<int>(rng.below(node_choices)),
            per_node = 1 + static_cast<int>(rng.below(max_per_node));
  const Topology topo(nodes, nodes * per_node);
  const int slots = 2 + static_cast<int>(rng.below(slot_choices));
  const int experts = 2 + static_cast<int>(rng.below(topo.num_ranks() * slots - 1));
  const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, max_top_k)));
  auto layout =
      testing::random_layout(seed, topo, experts, slots, min_fill + (1 - min_fill) * rng.unit());
  auto owned = testing::random_batch(seed * 3, 1 + static_cast<int64_t>(rng.below(max_tokens)),
                                     top_k, experts, topo.num_ranks(), skew);
  return {nodes, std::move(layout), std::move(owned)};
}

// Both class paths (per-chunk key tables up to 8 nodes, per-chunk expert lists above), on one to
// three threads, against the plain reference above: random layouts of 1 to 12 nodes and batches
// of up to 40000 tokens (1 to 4 token chunks on one thread, up to 12 on three).
TEST(BalancedCover, MatchesThePlainReference) {
  int num_chunked = 0, num_lists = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    SplitMix64 rng(seed * 997);
    const RandomCase c = random_case(seed, rng, 1, 12, 3, 3, 6, 40000, 0.0, 1.5);
    const int nodes = c.nodes;
    const ExpertLayout& layout = c.layout;
    const auto batch = c.owned.view();
    num_chunked += batch.num_tokens() >= 2 * 8192;
    num_lists += nodes > 8;
    const std::vector<RankId> expected = balanced_cover_reference(batch, layout);
    for (int threads : {1, 3}) {
      std::vector<RankId> exec(batch.num_tasks());
      assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, threads}, exec);
      ASSERT_EQ(exec, expected) << "seed " << seed << ", " << nodes << " nodes, " << threads
                                << " threads";
    }
  }
  EXPECT_GT(num_chunked, 10);
  EXPECT_GT(num_lists, 5);
}

TEST(BalancedCover, SameResultForAnyChunkingAndBothClassPaths) {
  // 100000 tokens: 4 token chunks with one thread, 12 with three (the class counts and the quota
  // mapping run per chunk); 3 nodes use the per-chunk key tables, 10 nodes the per-expert lists.
  for (int nodes : {3, 10}) {
    Topology topo(nodes, nodes * 2);
    const int experts = 3 * topo.num_ranks();
    auto layout = testing::random_layout(static_cast<uint64_t>(nodes), topo, experts, 5, 0.7);
    auto owned = testing::random_batch(11, 100000, 4, experts, topo.num_ranks(), 1.5);
    auto batch = owned.view();
    for (double tolerance : {-1.0, 0.05}) {
      std::vector<RankId> one(batch.num_tasks()), three(batch.num_tasks());
      assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 1}, one, tolerance);
      assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 3}, three, tolerance);
      EXPECT_EQ(one, three) << nodes << " nodes, tolerance " << tolerance;
      validate_assignment(batch, layout, one);
      if (tolerance < 0) {
        std::vector<uint64_t> covers(batch.num_tokens());
        remote_node_covers(batch, layout, {}, {}, covers);
        int64_t cover_total = 0;
        for (uint64_t c : covers) cover_total += std::popcount(c);
        EXPECT_EQ(eval::cross_node_transfers(batch, one, topo).dedup, cover_total);
        // Tasks of a class (expert, allowed nodes) take its quotas, ascending by rank, in token
        // order: along the tokens, a class's ranks never go down (across chunk boundaries too).
        std::map<std::pair<ExpertId, uint64_t>, RankId> last_rank;
        int64_t decreases = 0;
        for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
          const uint64_t reach = covers[t] | (uint64_t{1} << topo.node_of(batch.source_of(t)));
          for (int k = 0; k < batch.top_k(); ++k) {
            const ExpertId e = batch.experts_of(t)[k];
            auto [it, fresh] = last_rank.try_emplace({e, reach & layout.node_mask(e)}, -1);
            const RankId r = one[t * batch.top_k() + k];
            decreases += r < it->second ? 1 : 0;
            it->second = r;
          }
        }
        EXPECT_EQ(decreases, 0) << nodes << " nodes";
      }
    }
  }
}

// A kept workspace changes no result: one reused across batches that grow and shrink, layouts of
// both class paths (up to 8 nodes: key tables; more: per-expert lists), with and without the
// spill, gives what a call with scratch of its own gives.
TEST(BalancedCover, KeptWorkspaceGivesTheSameAssignment) {
  BalancedCoverWorkspace workspace;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SplitMix64 rng(seed * 613);
    const int nodes = seed % 4 == 0 ? 9 + static_cast<int>(rng.below(4))
                                    : 1 + static_cast<int>(rng.below(6)),
              per_node = 1 + static_cast<int>(rng.below(3));
    const Topology topo(nodes, nodes * per_node);
    const int slots = 1 + static_cast<int>(rng.below(3));
    const int experts = 1 + static_cast<int>(rng.below(topo.num_ranks() * slots));
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 6)));
    auto layout = testing::random_layout(seed, topo, experts, slots, rng.unit());
    auto owned = testing::random_batch(seed * 3, static_cast<int64_t>(rng.below(3000)), top_k,
                                       experts, topo.num_ranks(), 1.5);
    auto batch = owned.view();
    const double tolerance = rng.below(2) ? 0.05 : -1.0;
    std::vector<RankId> own(batch.num_tasks()), kept(batch.num_tasks());
    assign_balanced_cover(batch, layout, {}, {}, own, tolerance);
    assign_balanced_cover(batch, layout, {}, {}, kept, tolerance, &workspace);
    EXPECT_EQ(own, kept) << "seed " << seed;
  }
  // A batch of several token chunks on two threads (the parallel class pass and mapping), after
  // the workspace held the smaller batches above, then a small one again.
  for (const int64_t num_tokens : {40000, 700}) {
    const Topology topo(4, 16);
    auto layout = testing::random_layout(9, topo, 40, 4, 0.8);
    auto owned = testing::random_batch(10, num_tokens, 4, 40, topo.num_ranks(), 1.5);
    auto batch = owned.view();
    std::vector<RankId> own(batch.num_tasks()), kept(batch.num_tasks());
    assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 2}, own, 0.05);
    assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, 2}, kept, 0.05, &workspace);
    EXPECT_EQ(own, kept) << num_tokens << " tokens";
  }
  EXPECT_GT(workspace.capacity_bytes(), 0u);
}

// Batches of 1 to 30 tokens, where classes of one expert often tie on count and on their number
// of ranks (large batches almost never do), so the class order's last tie-break (the mask) decides.
TEST(BalancedCover, FewTokenBatchesMatchThePlainReference) {
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    SplitMix64 rng(seed * 613);
    const RandomCase c = random_case(seed, rng, 2, 5, 2, 2, 4, 30, 0.5, 0.5);
    const ExpertLayout& layout = c.layout;
    const auto batch = c.owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    assign_balanced_cover(batch, layout, {}, {}, exec);
    ASSERT_EQ(exec, balanced_cover_reference(batch, layout)) << "seed " << seed;
  }
}

}  // namespace
}  // namespace cobalt::assign
