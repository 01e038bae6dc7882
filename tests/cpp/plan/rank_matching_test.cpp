#include "cobalt/plan/rank_matching.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/intra_node_rebalance.hpp"

namespace cobalt::plan {
namespace {

int64_t total_of(const std::vector<int64_t>& weight, const std::vector<int>& row2col, int n) {
  int64_t total = 0;
  for (int row = 0; row < n; ++row) total += weight[static_cast<size_t>(row) * n + row2col[row]];
  return total;
}

bool is_permutation_of_n(std::vector<int> perm, int n) {
  std::sort(perm.begin(), perm.end());
  std::vector<int> expected(n);
  std::iota(expected.begin(), expected.end(), 0);
  return perm == expected;
}

// Property: on random matrices (few distinct values, so many optima tie, and wide signed ones) the
// Hungarian matching is a permutation reaching the brute-force optimum.
TEST(RankMatching, MatchesBruteForceOnRandomMatrices) {
  SplitMix64 rng(7);
  for (int trial = 0; trial < 600; ++trial) {
    const int n = static_cast<int>(rng.below(9));  // 0..8
    const bool narrow = trial % 2 == 0;
    std::vector<int64_t> weight(static_cast<size_t>(n) * n);
    for (auto& w : weight) {
      w = narrow ? static_cast<int64_t>(rng.below(3))
                 : static_cast<int64_t>(rng.below(2'000'001)) - 1'000'000;
    }
    const auto row2col = max_weight_perfect_matching(weight, n);
    ASSERT_EQ(static_cast<int>(row2col.size()), n);
    ASSERT_TRUE(is_permutation_of_n(row2col, n)) << "trial " << trial;
    if (n == 0) continue;
    EXPECT_EQ(total_of(weight, row2col, n), max_weight_perfect_matching_brute_force(weight, n))
        << "trial " << trial << " n " << n;
    EXPECT_EQ(max_weight_perfect_matching(weight, n), row2col);  // deterministic
  }
}

TEST(RankMatching, LargerInstancesBeatEveryRandomPermutation) {
  SplitMix64 rng(11);
  const int n = 72;  // a rack-scale NVLink domain
  std::vector<int64_t> weight(static_cast<size_t>(n) * n);
  for (auto& w : weight) w = static_cast<int64_t>(rng.below(100));
  const auto best = max_weight_perfect_matching(weight, n);
  ASSERT_TRUE(is_permutation_of_n(best, n));
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  for (int trial = 0; trial < 200; ++trial) {
    for (int i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    EXPECT_GE(total_of(weight, best, n), total_of(weight, perm, n));
  }
}

TEST(RankMatching, RejectsBadInput) {
  const auto code_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  std::vector<int64_t> three(3, 0);
  EXPECT_EQ(code_of([&] { max_weight_perfect_matching(three, 2); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { max_weight_perfect_matching({}, -1); }), ErrorCode::kInvalidArgument);
  std::vector<int64_t> huge = {int64_t{1} << 41};
  EXPECT_EQ(code_of([&] { max_weight_perfect_matching(huge, 1); }), ErrorCode::kInvalidArgument);
  ExpertLayout layout(Topology(1, 2), 2, 1, {0, 1});
  std::vector<std::vector<ExpertId>> groups = {{0}, {5}};
  EXPECT_EQ(code_of([&] { keep_replicas_in_place(layout, 0, groups); }),
            ErrorCode::kInvalidArgument);
  groups = {{0}};
  EXPECT_EQ(code_of([&] { keep_replicas_in_place(layout, 0, groups); }),
            ErrorCode::kInvalidArgument);
}

TEST(RankMatching, RecoversShuffledRanksAndKeepsIdentityOnTies) {
  // 2 nodes x 3 ranks x 2 slots; node 1 holds {4,5} {6,7} {8,9}.
  ExpertLayout layout(Topology(2, 6), 10, 2, {0, 1, 2, 3, 0, 5, 4, 5, 6, 7, 8, 9});
  std::vector<std::vector<ExpertId>> shuffled = {{8, 9}, {4, 5}, {6, 7}};
  EXPECT_EQ(keep_replicas_in_place(layout, 1, shuffled), (std::vector<int>{2, 0, 1}));
  // Nothing can stay: groups keep their own index.
  std::vector<std::vector<ExpertId>> fresh = {{0, 1}, {2, 3}, {}};
  EXPECT_EQ(keep_replicas_in_place(layout, 1, fresh), (std::vector<int>{0, 1, 2}));
}

// Replicas of the node's groups that stay on their rank under group2rank.
int64_t kept_replicas(const ExpertLayout& current, NodeId node,
                      const std::vector<std::vector<ExpertId>>& groups,
                      const std::vector<int>& group2rank) {
  const RankId first = current.topology().first_rank_of(node);
  int64_t kept = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (ExpertId e : groups[g]) kept += current.holds(first + group2rank[g], e);
  }
  return kept;
}

// The most replicas any permutation of `layout`'s rank contents over the node's ranks keeps.
int64_t best_kept_by_brute_force(const ExpertLayout& current, const ExpertLayout& layout,
                                 NodeId node) {
  const int per_node = layout.topology().ranks_per_node();
  const RankId first = layout.topology().first_rank_of(node);
  std::vector<int64_t> weight(static_cast<size_t>(per_node) * per_node, 0);
  for (int g = 0; g < per_node; ++g) {
    for (ExpertId e : layout.slots_of(first + g)) {
      if (e == kEmptySlot) continue;
      for (int i = 0; i < per_node; ++i) weight[g * per_node + i] += current.holds(first + i, e);
    }
  }
  return max_weight_perfect_matching_brute_force(weight, per_node);
}

int64_t kept_in_place(const ExpertLayout& current, const ExpertLayout& layout, NodeId node) {
  const int per_node = layout.topology().ranks_per_node();
  const RankId first = layout.topology().first_rank_of(node);
  int64_t kept = 0;
  for (int i = 0; i < per_node; ++i) {
    for (ExpertId e : layout.slots_of(first + i))
      kept += e != kEmptySlot && current.holds(first + i, e);
  }
  return kept;
}

// Property: pack_ranks with a previous layout keeps as many replicas in place as the best
// permutation of its own packed groups (checked by brute force), and realises the plan exactly.
TEST(RankMatching, PackRanksKeepsTheMostReplicasPossibleForItsGroups) {
  SplitMix64 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int num_experts = 24, per_node = 2 + static_cast<int>(rng.below(5));  // 2..6 ranks
    const Topology topo(2, 2 * per_node);
    const int slots = (num_experts + topo.num_ranks() - 1) / topo.num_ranks() + 1;
    std::vector<double> w(num_experts), c(static_cast<size_t>(num_experts) * num_experts, 0.0);
    for (auto& v : w) v = 1 + 50 * rng.unit() * rng.unit();
    for (int i = 0; i < num_experts; ++i) {
      for (int j = i + 1; j < num_experts; ++j)
        c[i * num_experts + j] = c[j * num_experts + i] = rng.below(4);
    }
    GlobalPlanInput in{topo, num_experts, slots, 0.3, w, c};
    HeuristicOptions options{1, 2, false, 5};
    options.seed = trial;
    const ExpertLayout previous =
        pack_ranks(in, plan_global_heuristic(in, options).plan, nullptr, nullptr);
    for (auto& v : w) v *= 0.5 + rng.unit();  // loads drift before the next plan
    in.expert_load = w;
    options.seed = trial + 1000;
    const NodePlan next = plan_global_heuristic(in, options).plan;
    const ExpertLayout layout = pack_ranks(in, next, &previous, nullptr);
    for (NodeId n = 0; n < topo.num_nodes(); ++n) {
      EXPECT_EQ(kept_in_place(previous, layout, n), best_kept_by_brute_force(previous, layout, n))
          << "trial " << trial << " node " << n;
      for (ExpertId e = 0; e < num_experts; ++e) {
        EXPECT_EQ(static_cast<int>(layout.ranks_of(e, n).size()), next.x(e, n));
      }
    }
  }
}

// Property: stage-2 rebalancing moves no more replicas than the best permutation of its groups
// needs, and the maximum rank load does not depend on that permutation.
TEST(RankMatching, RebalanceMovesTheFewestReplicasForItsGroups) {
  SplitMix64 rng(5);
  int rebalanced_nodes = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int per_node = 2 + static_cast<int>(rng.below(6)), slots = 3,
              num_experts = 2 * per_node * slots;
    const Topology topo(2, 2 * per_node);
    std::vector<ExpertId> ids(num_experts);
    std::iota(ids.begin(), ids.end(), 0);
    for (int i = num_experts - 1; i > 0; --i) std::swap(ids[i], ids[rng.below(i + 1)]);
    const ExpertLayout layout(topo, num_experts, slots, ids);
    std::vector<double> loads(ids.size());
    for (auto& v : loads) v = std::floor(1 + 20 * rng.unit() * rng.unit());
    const auto result = rebalance_intra_node(layout, loads);
    int64_t moves = 0;
    for (NodeId n = 0; n < 2; ++n) {
      const int64_t kept = kept_in_place(layout, result.layout, n);
      EXPECT_EQ(kept, best_kept_by_brute_force(layout, result.layout, n)) << "trial " << trial;
      moves += per_node * slots - kept;
      rebalanced_nodes += kept < per_node * slots;
    }
    EXPECT_EQ(result.num_moves, moves);
  }
  EXPECT_GT(rebalanced_nodes, 20);  // the property was exercised
}

// A repacking that does not lower the node's maximum moves nothing (min_gain 0).
// rank 0 {e0: 3, e1: 3, e2: 2}, rank 1 {e3: 4, e4: 2, e5: 2}: LPT gives {e0, e1, e5} / {e3, e2,
// e4}, the same maximum 8.
TEST(IntraNodeRebalance, AnEqualMaximumMovesNothing) {
  const ExpertLayout layout(Topology(1, 2), 6, 3, {0, 1, 2, 3, 4, 5});
  const std::vector<double> loads = {3, 3, 2, 4, 2, 2};
  const auto result = rebalance_intra_node(layout, loads, 0.0);
  EXPECT_EQ(result.num_moves, 0);
}

// keep_most_in_place keeps the most replicas and, among those matchings, the most groups on
// their own rank (the identity bonus): every 0/1 kept matrix of 3 groups, against brute force.
TEST(KeepMostInPlace, TiesKeepGroupsOnTheirOwnRank) {
  const int n = 3;
  for (int bits = 0; bits < (1 << 9); ++bits) {
    std::vector<int64_t> kept(9);
    for (int i = 0; i < 9; ++i) kept[i] = (bits >> i) & 1;
    std::vector<int> perm = {0, 1, 2};
    std::pair<int64_t, int> best{-1, -1};
    do {
      int64_t sum = 0;
      int fixed = 0;
      for (int g = 0; g < n; ++g) {
        sum += kept[g * n + perm[g]];
        fixed += perm[g] == g;
      }
      best = std::max(best, std::pair<int64_t, int>{sum, fixed});
    } while (std::next_permutation(perm.begin(), perm.end()));
    const auto got = keep_most_in_place(kept, n);
    int64_t sum = 0;
    int fixed = 0;
    for (int g = 0; g < n; ++g) {
      sum += kept[g * n + got[g]];
      fixed += got[g] == g;
    }
    ASSERT_EQ(std::make_pair(sum, fixed), best) << "bits " << bits;
  }
}

}  // namespace
}  // namespace cobalt::plan
