// The kept flow behind a layout's balance floor (plan/rank_bound_flow.hpp) against flows built
// from scratch after every change, and what one more holder can add to it.
#include "plan/rank_bound_flow.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cobalt/core/rng.hpp"
#include "plan/floor_swaps_testing.hpp"

namespace cobalt::plan {
namespace {

using namespace testing_floor_swaps;

// The kept network against a flow built from scratch after every change: whether the tasks fit,
// and the tight set when they do not.
TEST(RankBoundFlow, KeptNetworkAgreesWithFreshFlows) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SplitMix64 rng(seed * 40503);
    const int num_ranks = 1 + static_cast<int>(rng.below(12));
    const int experts = 1 + static_cast<int>(rng.below(16));
    const auto counts = random_counts(rng, experts, 30);
    auto holders = random_holders(rng, experts, num_ranks, 3);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    int64_t bound = static_cast<int64_t>(rng.below(static_cast<uint64_t>(total) + 2));
    detail::RankBoundNetwork network(counts, num_ranks, holders, bound);
    for (int op = 0; op < 12; ++op) {
      const auto holders_of = [&](ExpertId e) -> const std::vector<RankId>& { return holders[e]; };
      detail::TightSet tight;
      const bool want = detail::fits_under(counts, num_ranks, holders_of, bound, total, &tight);
      ASSERT_EQ(network.fits(), want) << "seed " << seed << " op " << op;
      if (!want) {
        const auto got = network.tight_set();
        ASSERT_EQ(got.experts, tight.experts) << "seed " << seed << " op " << op;
        ASSERT_EQ(got.ranks, tight.ranks) << "seed " << seed << " op " << op;
      }
      const auto e = static_cast<ExpertId>(rng.below(experts));
      const auto r = static_cast<RankId>(rng.below(num_ranks));
      const bool held = std::find(holders[e].begin(), holders[e].end(), r) != holders[e].end();
      switch (rng.below(3)) {
        case 0:
          if (!held) {
            network.add_holder(e, r);
            holders[e].push_back(r);
          }
          break;
        case 1:
          if (held) {
            network.remove_holder(e, r);
            holders[e].erase(std::find(holders[e].begin(), holders[e].end(), r));
          }
          break;
        default:
          bound = static_cast<int64_t>(rng.below(static_cast<uint64_t>(total) + 2));
          network.set_bound(bound);
      }
    }
  }
}

// What the group search's pruning rests on: one more holder (e on a rank r) routes at most
// min(bound, count(e)) more tasks under a bound (the minimum cut grows by r's capacity with r
// moved to the source side, or by count(e) with e moved to the sink side), and a change that also
// removes a replica from r routes no more. So k swaps lower a shortfall by at most k x bound.
TEST(RankBoundFlow, OneMoreHolderRoutesAtMostOneRanksBound) {
  int num_added = 0, num_at_bound = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SplitMix64 rng(seed * 7919);
    const int num_ranks = 1 + static_cast<int>(rng.below(10));
    const int experts = 1 + static_cast<int>(rng.below(14));
    const auto counts = random_counts(rng, experts, 30);
    const auto holders = random_holders(rng, experts, num_ranks, 4);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t bound = static_cast<int64_t>(rng.below(static_cast<uint64_t>(total) / 2 + 2));
    detail::RankBoundNetwork before(counts, num_ranks, holders, bound);
    before.fits();
    for (ExpertId e = 0; e < experts; ++e) {
      for (RankId r = 0; r < num_ranks; ++r) {
        if (std::find(holders[e].begin(), holders[e].end(), r) != holders[e].end()) continue;
        detail::RankBoundNetwork added = before;
        added.add_holder(e, r);
        added.fits();
        const int64_t gain = added.routed() - before.routed();
        ASSERT_LE(gain, std::min(bound, counts[e])) << "seed " << seed << " e " << e << " r " << r;
        ++num_added;
        num_at_bound += gain == bound && gain > 0;
        // Replacing a replica on r instead gains no more.
        for (ExpertId f = 0; f < experts; ++f) {
          if (f == e || holders[f].size() < 2) continue;
          if (std::find(holders[f].begin(), holders[f].end(), r) == holders[f].end()) continue;
          detail::RankBoundNetwork swapped = added;
          swapped.remove_holder(f, r);
          swapped.fits();
          ASSERT_LE(swapped.routed(), added.routed()) << "seed " << seed;
        }
      }
    }
  }
  EXPECT_GT(num_added, 1000);
  EXPECT_GT(num_at_bound, 10);  // the bound is reached, so it is the tightest of its kind
}

}  // namespace
}  // namespace cobalt::plan
