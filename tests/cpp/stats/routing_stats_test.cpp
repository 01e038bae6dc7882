#include "cobalt/stats/routing_stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

// Batches of 1 to 3 chunks of 65536 tokens (the size count_routing splits at): 2 and 3 threads
// sum partial matrices, in chunk order, into the outputs.
TEST(RoutingStats, CountsMatchBruteForceForAnyThreadCount) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const int64_t num_tokens = 70000 * static_cast<int64_t>(1 + seed % 3) + seed * 1000;
    auto owned = testing::random_batch(seed, num_tokens, 4, 24, 8, 1.0);
    auto batch = owned.view();
    const int num_experts = 24;
    std::vector<int64_t> ref_loads(num_experts, 0), ref_coact(num_experts * num_experts, 0);
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      auto row = batch.experts_of(t);
      for (int a = 0; a < 4; ++a) {
        ++ref_loads[row[a]];
        for (int b = 0; b < 4; ++b) {
          if (a != b) ++ref_coact[row[a] * num_experts + row[b]];
        }
      }
    }
    for (int threads : {1, 2, 3, 8}) {
      std::vector<int64_t> loads(num_experts), coact(num_experts * num_experts);
      count_routing(batch, loads, coact, threads);
      EXPECT_EQ(loads, ref_loads) << "threads " << threads;
      EXPECT_EQ(coact, ref_coact) << "threads " << threads;
    }
  }
}

// The fast path (per-chunk counts in selection order, unrolled common K, the tiled fold) against
// the definition on random shapes: K from 1 to 16, E from K to 300 (tiles cut at odd places),
// skewed and uniform routing, batches from empty to several chunks, any thread count.
TEST(RoutingStats, CountRoutingEqualsTheReferenceOnRandomShapes) {
  SplitMix64 shapes(2026);
  for (int trial = 0; trial < 60; ++trial) {
    const int top_k = 1 + static_cast<int>(shapes.below(16));
    const int num_experts = top_k + static_cast<int>(shapes.below(300 - top_k));
    const int64_t num_tokens =
        trial % 10 == 0 ? static_cast<int64_t>(shapes.below(3))
                        : static_cast<int64_t>(shapes.below(trial % 3 == 0 ? 200000 : 3000));
    const double skew = trial % 2 == 0 ? 0.0 : 3.0;
    auto owned = testing::random_batch(trial + 100, num_tokens, top_k, num_experts, 4, skew);
    auto batch = owned.view();
    std::vector<int64_t> ref_loads(num_experts), ref_coact(num_experts * num_experts);
    count_routing_reference(batch, ref_loads, ref_coact);
    for (int threads : {1, 2, 3}) {
      std::vector<int64_t> loads(num_experts, -7), coact(num_experts * num_experts, -7);
      count_routing(batch, loads, coact, threads);  // outputs poisoned: every entry is written
      ASSERT_EQ(loads, ref_loads) << "trial " << trial << " threads " << threads;
      ASSERT_EQ(coact, ref_coact) << "trial " << trial << " K " << top_k << " E " << num_experts
                                  << " T " << num_tokens << " threads " << threads;
    }
  }
}

TEST(RoutingStats, CountRoutingRejectsMisSizedOutputs) {
  auto owned = testing::random_batch(1, 10, 2, 6, 2);
  std::vector<int64_t> loads(6), coact(35);
  EXPECT_THROW(count_routing(owned.view(), loads, coact), Error);
  EXPECT_THROW(count_routing_reference(owned.view(), loads, coact), Error);
  std::vector<int64_t> right_coact(36);
  EXPECT_THROW(count_routing(owned.view(), loads, right_coact, -1), Error);  // threads < 0
  RoutingStats stats(6, 0.9);
  EXPECT_THROW(stats.update(owned.view(), -3), Error);
}

TEST(RoutingStats, EmaArithmetic) {
  // Two experts, one token choosing both, then one token choosing expert 0 and 2.
  std::vector<ExpertId> ids1 = {0, 1}, ids2 = {0, 2};
  std::vector<RankId> src = {0};
  RoutingStats ema(3, 0.75);
  ema.update(RoutingBatch(ids1, src, 2, 3, 1));
  // First update initialises: w = (1, 1, 0), c01 = 1.
  EXPECT_DOUBLE_EQ(ema.expert_load()[0], 1.0);
  EXPECT_DOUBLE_EQ(ema.coactivation(0, 1), 1.0);
  ema.update(RoutingBatch(ids2, src, 2, 3, 1));
  // w0 = 0.75 * 1 + 0.25 * 1 = 1; w1 = 0.75; w2 = 0.25; c01 = 0.75; c02 = 0.25.
  EXPECT_DOUBLE_EQ(ema.expert_load()[0], 1.0);
  EXPECT_DOUBLE_EQ(ema.expert_load()[1], 0.75);
  EXPECT_DOUBLE_EQ(ema.expert_load()[2], 0.25);
  EXPECT_DOUBLE_EQ(ema.coactivation(0, 1), 0.75);
  EXPECT_DOUBLE_EQ(ema.coactivation(2, 0), 0.25);
  EXPECT_DOUBLE_EQ(ema.coactivation(1, 2), 0.0);
  // Ochiai(0,1) = 0.75 / sqrt(1 * 0.75)
  EXPECT_NEAR(ema.ochiai(0, 1), 0.75 / std::sqrt(0.75), 1e-12);

  RoutingStats exact = RoutingStats::exact_counts(3);
  exact.update(RoutingBatch(ids1, src, 2, 3, 1));
  exact.update(RoutingBatch(ids2, src, 2, 3, 1));
  EXPECT_DOUBLE_EQ(exact.expert_load()[0], 2.0);
  EXPECT_DOUBLE_EQ(exact.coactivation(0, 2), 1.0);
  EXPECT_THROW(RoutingStats(3, 1.0), Error);
}

// Micro-batches folded into their step's observation give what one update with their
// concatenation gives (property test on random batches; EMA, first observation and exact counts).
TEST(RoutingStats, FoldedMicroBatchesAreTheConcatenatedStep) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SplitMix64 rng(seed);
    const int experts = 4 + static_cast<int>(rng.below(30));
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 8)));
    const bool exact = seed % 5 == 0;
    const double decay = exact ? 0.0 : 0.05 * static_cast<double>(rng.below(19));
    RoutingStats folded(experts, decay, exact), concatenated(experts, decay, exact);
    for (int step = 0; step < 4; ++step) {
      const auto whole = testing::random_batch(seed * 100 + step, 300, top_k, experts, 8, 1.0);
      // Split into up to three micro-batches (an empty one included now and then).
      const int64_t a = rng.below(301), b = a + rng.below(static_cast<uint32_t>(301 - a));
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, a}, {a, b}, {b, 300}}) {
        const RoutingBatch part(
            std::span(whole.topk_ids).subspan(begin * top_k, (end - begin) * top_k),
            std::span(whole.source_rank).subspan(begin, end - begin), top_k, experts, 8);
        // The step's first batch with tasks is its observation; later ones fold into it.
        if (folded.num_updates() == step) {
          folded.update(part);
        } else {
          folded.fold_into_last_update(part);
        }
      }
      concatenated.update(whole.view());
      ASSERT_EQ(folded.num_updates(), concatenated.num_updates());
      for (int e = 0; e < experts; ++e) {
        ASSERT_NEAR(folded.expert_load()[e], concatenated.expert_load()[e],
                    1e-9 * (1 + concatenated.expert_load()[e]))
            << "seed " << seed << " step " << step;
      }
      for (size_t i = 0; i < concatenated.coactivation().size(); ++i) {
        ASSERT_NEAR(folded.coactivation()[i], concatenated.coactivation()[i],
                    1e-9 * (1 + concatenated.coactivation()[i]));
      }
    }
  }
  RoutingStats fresh(3, 0.5);  // no update yet: a fold is the first update
  std::vector<ExpertId> ids = {0, 1};
  std::vector<RankId> src = {0};
  fresh.fold_into_last_update(RoutingBatch(ids, src, 2, 3, 1));
  EXPECT_EQ(fresh.num_updates(), 1);
  EXPECT_DOUBLE_EQ(fresh.coactivation(0, 1), 1.0);
}

TEST(RoutingStats, OchiaiSummaries) {
  // 3 experts. w = (4, 2, 2); c01 = 2, c02 = 1, c12 = 0.
  // Ochiai(0,1) = 2/sqrt(8), Ochiai(0,2) = 1/sqrt(8).
  std::vector<double> w = {4, 2, 2};
  std::vector<double> c = {0, 2, 1, 2, 0, 0, 1, 0, 0};
  auto s = summarize_ochiai(w, c);
  const double o01 = 2 / std::sqrt(8.0), o02 = 1 / std::sqrt(8.0);
  // count-weighted: (2 * o01 + 1 * o02) / 3
  EXPECT_NEAR(s.count_weighted, (2 * o01 + o02) / 3, 1e-12);
  // top-partner: (4 * o01 + 2 * o01 + 2 * o02) / 8
  EXPECT_NEAR(s.top_partner, (4 * o01 + 2 * o01 + 2 * o02) / 8, 1e-12);
}

TEST(RoutingStats, HotSetChurn) {
  std::vector<double> a = {9, 8, 7, 1, 0, 0};
  std::vector<double> b = {9, 0, 7, 8, 0, 0};
  // hot-3 of a = {0,1,2}; of b = {0,2,3}: one of three changed.
  EXPECT_NEAR(hot_set_churn(a, b, 3), 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(hot_set_churn(a, a, 3), 0.0);
}

// Loads and counts that are not loads (negative, NaN, infinite) are refused naming the entry,
// instead of a summary of 1.5 or NaN, a churn of 1 or negative replica loads.
TEST(RoutingStats, SummariesRefuseValuesThatAreNotLoads) {
  const auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<double> ones(4, 1.0), square(16, 1.0);
  std::vector<double> negative = ones, nan_load = ones, inf_square = square;
  negative[0] = -1;
  nan_load[2] = std::nan("");
  inf_square[5] = std::numeric_limits<double>::infinity();
  EXPECT_NE(message_of([&] {
              summarize_ochiai(negative, square);
            }).find("ochiai summary: expert load: entry 0 is -1, must be finite and >= 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { summarize_ochiai(ones, inf_square); }).find("entry 5 is inf"),
            std::string::npos);
  EXPECT_NE(message_of([&] { hot_set_churn(ones, nan_load, 2); }).find("next load: entry 2"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              hot_set_churn(ones, ones, 0);
            }).find("hot-set churn: hot count 0 must be >= 1"),
            std::string::npos);
  ReplicaLoads loads(2, 2, 0.5);
  EXPECT_NE(message_of([&] { loads.reset(negative); }).find("replica loads: entry 0 is -1"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              loads.update(std::vector<int64_t>{1, 2, -3, 4});
            }).find("replica loads: count -3 of slot 2 must be >= 0"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              ReplicaLoads(-1, 2, 0.5);
            }).find("replica loads: number of ranks -1 out of range [1, 8192]"),
            std::string::npos);
  EXPECT_EQ(message_of([&] { loads.reset(ones); }), "no error");
}

TEST(RoutingStats, AStepWithoutTasksIsNoObservation) {
  std::vector<ExpertId> ids = {0, 1}, none;
  std::vector<RankId> src = {0}, no_src;
  RoutingStats ema(3, 0.75);
  ema.update(RoutingBatch(none, no_src, 2, 3, 1));
  EXPECT_EQ(ema.num_updates(), 0);
  ema.update(RoutingBatch(ids, src, 2, 3, 1));  // still the first update: it initialises
  EXPECT_EQ(ema.num_updates(), 1);
  EXPECT_DOUBLE_EQ(ema.expert_load()[0], 1.0);
  ema.update(RoutingBatch(none, no_src, 2, 3, 1));
  EXPECT_EQ(ema.num_updates(), 1);
  EXPECT_DOUBLE_EQ(ema.expert_load()[0], 1.0);
}

// Pre-computed counts must look like count_routing's: non-negative, co-activation symmetric.
TEST(RoutingStats, UpdateCountsRejectsCountsCountRoutingCannotMake) {
  RoutingStats stats(3, 0.5);
  const std::vector<int64_t> loads = {2, 1, 1};
  std::vector<int64_t> coact = {0, 1, 1, 1, 0, 0, 1, 0, 0};
  stats.update_counts(loads, coact);
  EXPECT_EQ(stats.num_updates(), 1);
  coact[1 * 3 + 2] = 4;  // [1][2] = 4 but [2][1] = 0
  try {
    stats.update_counts(loads, coact);
    ADD_FAILURE() << "accepted an asymmetric matrix";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("must be symmetric and >= 0: [1][2] = 4, [2][1] = 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(stats.update_counts(std::vector<int64_t>{2, -1, 1},
                                   std::vector<int64_t>{0, 1, 1, 1, 0, 0, 1, 0, 0}),
               Error);
  // A non-zero diagonal, and a pair counted more often than one of its experts (no batch makes
  // either; Ochiai came out as 7).
  coact = {0, 1, 1, 1, 0, 0, 1, 0, 0};
  coact[2 * 3 + 2] = 1;
  try {
    stats.update_counts(loads, coact);
    ADD_FAILURE() << "accepted a non-zero diagonal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("co-activation [2][2] = 1 must be 0"), std::string::npos)
        << e.what();
  }
  coact = {0, 7, 1, 7, 0, 0, 1, 0, 0};
  try {
    stats.update_counts(loads, coact);
    ADD_FAILURE() << "accepted co-activation above the loads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0][1] = 7 exceeds the counts of expert 0 (2) or 1 (1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(stats.update_counts(std::vector<int64_t>{0, 0, 0}, coact), Error);  // was dropped
  EXPECT_EQ(stats.num_updates(), 1);  // nothing was added by the rejected calls
}

// The tiled check over several tiles (E = 130: two full 64-wide tiles and a partial one): every
// single bad entry is caught wherever it lies, and of two the first in row-major order of the upper
// triangle is named.
TEST(RoutingStats, UpdateCountsFindsBadEntriesInEveryTile) {
  const int num_experts = 130;
  auto owned = testing::random_batch(5, 2000, 4, num_experts, 2, 1.0);
  std::vector<int64_t> loads(num_experts), coact(num_experts * num_experts);
  count_routing(owned.view(), loads, coact);
  RoutingStats stats(num_experts, 0.5);
  stats.update_counts(loads, coact);
  const std::vector<std::pair<int, int>> cells = {{0, 0},     {0, 129},   {63, 64}, {64, 63},
                                                  {127, 128}, {129, 129}, {5, 70},  {129, 1}};
  for (auto [i, j] : cells) {
    auto bad = coact;
    bad[i * num_experts + j] = i == j ? -1 : bad[i * num_experts + j] + 1;
    EXPECT_THROW(stats.update_counts(loads, bad), Error) << i << ", " << j;
  }
  // [0][100] comes first in row-major order, [1][2] first in tile order (its tile is checked
  // before the tile of [0][100]): the row-major one must be named.
  auto two = coact;
  two[1 * num_experts + 2] += 3;
  two[100 * num_experts + 0] += 2;  // [0][100] != [100][0]
  try {
    stats.update_counts(loads, two);
    ADD_FAILURE() << "accepted an asymmetric matrix";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0][100] = "), std::string::npos) << e.what();
  }
  EXPECT_EQ(stats.num_updates(), 1);
}

TEST(RoutingStats, ReplicaTaskCountsBeyondInt16Slots) {
  const int num_experts = 40000;  // one rank holding every expert: slot indices above 32767
  std::vector<ExpertId> slots(num_experts);
  for (int e = 0; e < num_experts; ++e) slots[e] = e;
  const ExpertLayout layout(Topology(1, 1), num_experts, num_experts, slots);
  std::vector<ExpertId> ids = {39999, 5};
  std::vector<RankId> src = {0}, exec = {0, 0};
  const auto counts = replica_task_counts(RoutingBatch(ids, src, 2, num_experts, 1), layout, exec);
  EXPECT_EQ(counts[39999], 1);
  EXPECT_EQ(counts[5], 1);
}

TEST(RoutingStats, ReplicaTaskCounts) {
  // 1 node x 2 ranks, 2 slots: rank 0 {0, 1}, rank 1 {1, -}.
  ExpertLayout layout(Topology(1, 2), 2, 2, {0, 1, 1, -1});
  std::vector<ExpertId> ids = {0, 1, 1, 0};
  std::vector<RankId> src = {0, 1};
  RoutingBatch batch(ids, src, 2, 2, 2);
  std::vector<RankId> exec = {0, 1, 0, 0};
  auto counts = replica_task_counts(batch, layout, exec);
  EXPECT_EQ(counts, (std::vector<int64_t>{2, 1, 1, 0}));
  std::vector<RankId> bad = {1, 1, 0, 0};  // expert 0 on rank 1: not held
  EXPECT_THROW(replica_task_counts(batch, layout, bad), Error);
}

// The counts against a scan of each task's rank for its expert, on random layouts and
// assignments (every task on a holder of its expert).
TEST(RoutingStats, ReplicaTaskCountsMatchASimpleScan) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + static_cast<int>(rng.below(4)),
              per_node = 1 + static_cast<int>(rng.below(4));
    const Topology topo(nodes, nodes * per_node);
    const int num_experts = 2 + static_cast<int>(rng.below(30));
    const int slots =
        std::min(num_experts, (num_experts + topo.num_ranks() - 1) / topo.num_ranks() +
                                  static_cast<int>(rng.below(3)));
    std::vector<std::vector<ExpertId>> lists(topo.num_ranks());
    for (ExpertId e = 0; e < num_experts; ++e) {
      lists[rng.below(topo.num_ranks())].push_back(e);
    }
    // Spread to fit the slots, then fill spare slots with replicas of random experts.
    std::vector<ExpertId> all;
    for (auto& l : lists) all.insert(all.end(), l.begin(), l.end());
    for (auto& l : lists) l.clear();
    for (size_t i = 0; i < all.size(); ++i) lists[i % topo.num_ranks()].push_back(all[i]);
    for (auto& l : lists) {
      for (int tries = 0; tries < 4 && static_cast<int>(l.size()) < slots; ++tries) {
        const ExpertId e = static_cast<ExpertId>(rng.below(num_experts));
        if (std::find(l.begin(), l.end(), e) == l.end()) l.push_back(e);
      }
    }
    const ExpertLayout layout = ExpertLayout::from_rank_lists(topo, num_experts, slots, lists);
    const int top_k = 1 + static_cast<int>(rng.below(std::min(num_experts, 6)));
    const int64_t num_tokens = static_cast<int64_t>(rng.below(200));
    std::vector<ExpertId> ids;
    std::vector<RankId> src(num_tokens, 0), exec;
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::vector<ExpertId> row;
      while (static_cast<int>(row.size()) < top_k) {
        const ExpertId e = static_cast<ExpertId>(rng.below(num_experts));
        if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
      }
      for (ExpertId e : row) {
        std::vector<RankId> holders;
        for (RankId r = 0; r < topo.num_ranks(); ++r) {
          if (layout.holds(r, e)) holders.push_back(r);
        }
        ids.push_back(e);
        exec.push_back(holders[rng.below(holders.size())]);
      }
    }
    const RoutingBatch batch(ids, src, top_k, num_experts, topo.num_ranks());
    std::vector<int64_t> expected(static_cast<size_t>(topo.num_ranks()) * slots, 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto row = layout.slots_of(exec[i]);
      const auto it = std::find(row.begin(), row.end(), ids[i]);
      ++expected[static_cast<size_t>(exec[i]) * slots + (it - row.begin())];
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    EXPECT_EQ(replica_task_counts(batch, layout, exec), expected);
  }
}

// Bad tasks are reported in task order, whichever check fails first.
TEST(RoutingStats, ReplicaTaskCountsNameTheFirstBadTask) {
  ExpertLayout layout(Topology(1, 2), 2, 2, {0, 1, 1, -1});  // rank 0 {0, 1}, rank 1 {1, -}
  std::vector<ExpertId> ids = {0, 1, 1, 0};
  std::vector<RankId> src = {0, 1};
  const RoutingBatch batch(ids, src, 2, 2, 2);
  const auto error_of = [&](std::vector<RankId> exec) {
    try {
      replica_task_counts(batch, layout, exec);
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::kInternal, std::string("no error"));
  };
  auto [code, message] = error_of({0, 1, 5, 1});  // task 2's rank out of range, task 3 not held
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("task 2 has execution rank 5 out of range [0, 2)"), std::string::npos)
      << message;
  std::tie(code, message) = error_of({0, 1, 0, 1});  // task 3: expert 0 on rank 1
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("task 3 on rank 1 which lacks expert 0"), std::string::npos) << message;
  const RoutingBatch wider(std::vector<ExpertId>{2, 0}, std::vector<RankId>{0}, 2, 3, 2);
  EXPECT_THROW(replica_task_counts(wider, layout, std::vector<RankId>{0, 0}), Error);  // E 3 vs 2
  std::tie(code, message) = error_of({1, 1, 0, -1});  // task 0 not held comes before task 3
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("task 0 on rank 1 which lacks expert 0"), std::string::npos) << message;
}

// Co-activation above the smaller of the two experts' counts is impossible and refused (it is
// checked against the smaller count, not the larger).
TEST(RoutingStats, CoactivationAboveTheSmallerCountIsRejected) {
  RoutingStats stats(3, 0.5);
  const std::vector<int64_t> loads{2, 1, 1};
  std::vector<int64_t> coact(9, 0);
  coact[0 * 3 + 1] = coact[1 * 3 + 0] = 2;  // <= count of expert 0, > count of expert 1
  EXPECT_THROW(stats.update_counts(loads, coact), Error);
}

// replica_task_counts refuses execution rank G (one past the last) instead of counting it on
// another expert's slot.
TEST(RoutingStats, ReplicaTaskCountsRefusesRankG) {
  const Topology topo(1, 2);
  const auto layout = ExpertLayout::from_rank_lists(topo, 2, 2, {{0, 1}, {0}});
  testing::OwnedBatch b;
  b.top_k = 1;
  b.num_experts = 2;
  b.num_ranks = 2;
  b.topk_ids = {0};
  b.source_rank = {0};
  const std::vector<RankId> exec{2};
  EXPECT_THROW(replica_task_counts(b.view(), layout, exec), Error);
}

}  // namespace
}  // namespace cobalt
