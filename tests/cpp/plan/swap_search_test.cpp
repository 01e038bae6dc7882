// The upper bounds by which stage 2b skips flow checks (plan/swap_search.hpp, Headroom and
// SwapSearch::may_close; plan/rank_bound_flow.hpp, room_through and supply_through) against
// flows built from scratch and brute force over every single change and exchange.
#include "plan/swap_search.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/plan/floor_swaps.hpp"
#include "plan/floor_swaps_testing.hpp"
#include "plan/max_flow.hpp"
#include "plan/rank_bound_flow.hpp"

namespace cobalt::plan {
namespace {

using namespace testing_floor_swaps;

// The maximum flow of the floor's network at `bound` (source -> expert: its count -> its holders ->
// sink: bound per rank), built from scratch, with one more uncapped edge from the source to rank
// extra_rank (if >= 0) or from expert extra_expert to the sink (if >= 0): the independent
// computation of RankBoundNetwork::room_through and supply_through (their flow grows by these).
int64_t flow_with_extra_edge(const std::vector<int64_t>& counts,
                             const std::vector<std::vector<RankId>>& holders, int num_ranks,
                             int64_t bound, RankId extra_rank, ExpertId extra_expert) {
  const int num_experts = static_cast<int>(counts.size());
  const int source = num_experts + num_ranks, sink = source + 1;
  MaxFlow flow(num_experts + num_ranks + 2);
  const double uncapped = 1e15;
  for (ExpertId e = 0; e < num_experts; ++e) {
    flow.add_edge(source, e, static_cast<double>(counts[e]));
    for (RankId r : holders[e]) flow.add_edge(e, num_experts + r, uncapped);
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    flow.add_edge(num_experts + r, sink, static_cast<double>(bound));
  }
  if (extra_rank >= 0) flow.add_edge(source, num_experts + extra_rank, uncapped);
  if (extra_expert >= 0) flow.add_edge(extra_expert, sink, uncapped);
  return std::llround(flow.run(source, sink, 0.5));
}

// The bounds by which swaps and exchanges are left out untried, against brute force. At floor - 1
// with the tight set X, N(X): room_through(r) and supply_through(e) equal the growth of a flow
// built from scratch with one more uncapped edge (source -> r, e -> sink), and every single change
// and every exchange that gives a tight e a rank r outside N(X) routes at most min(room, supply)
// more tasks (reached with equality on some). Every such change that lowers the floor also passes
// an exchange's further conditions: Hall's condition for X and the moved expert f (missing +
// count(f) <= (floor - 1) x f's holders outside N(X), met with equality by some), and its rank a
// keeps another tight replica. The reference, which checks each change the bounds rule out with
// its own flow, runs on every instance.
TEST(SwapSearch, BoundsRuleOutOnlyChangesThatFail) {
  int num_changes = 0, num_lowering = 0, num_gain_at_bound = 0, num_hall_at_limit = 0,
      num_reference_rounds = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    SplitMix64 rng(seed * 15485863);
    const auto [topo, layout, counts, costs] = small_instance(seed, rng, 3, 3, 3);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (total == 0) continue;
    const int64_t floor = eval::min_max_rank_load(counts, layout);
    const int num_ranks = layout.num_ranks(), slots = layout.slots_per_rank();
    std::vector<std::vector<RankId>> holders(layout.num_experts());
    for (ExpertId e = 0; e < layout.num_experts(); ++e) {
      holders[e].assign(layout.ranks_of(e).begin(), layout.ranks_of(e).end());
    }
    detail::RankBoundNetwork below(counts, num_ranks, holders, floor - 1);
    ASSERT_FALSE(below.fits()) << "seed " << seed;
    const detail::TightSet tight = below.tight_set();
    const int64_t missing = below.total() - below.routed();
    const int64_t before = flow_with_extra_edge(counts, holders, num_ranks, floor - 1, -1, -1);
    ASSERT_EQ(before, below.routed()) << "seed " << seed;
    std::vector<int64_t> room(num_ranks, -1), supply(layout.num_experts(), -1);
    detail::RankBoundNetwork scratch = below;
    for (RankId r = 0; r < num_ranks; ++r) {
      if (tight.ranks[r]) continue;
      room[r] = below.room_through(r, scratch);
      ASSERT_EQ(room[r],
                flow_with_extra_edge(counts, holders, num_ranks, floor - 1, r, -1) - before)
          << "seed " << seed << " rank " << r;
    }
    for (ExpertId e = 0; e < layout.num_experts(); ++e) {
      if (!tight.experts[e]) continue;
      supply[e] = below.supply_through(e, scratch);
      ASSERT_EQ(supply[e],
                flow_with_extra_edge(counts, holders, num_ranks, floor - 1, -1, e) - before)
          << "seed " << seed << " expert " << e;
    }
    // The tasks routed under floor - 1 on a changed layout, and what the bounds allow.
    const auto check = [&](const std::vector<ExpertId>& changed, ExpertId e, RankId r) {
      const ExpertLayout after(topo, layout.num_experts(), slots, changed);
      std::vector<std::vector<RankId>> after_holders(layout.num_experts());
      for (ExpertId x = 0; x < layout.num_experts(); ++x) {
        after_holders[x].assign(after.ranks_of(x).begin(), after.ranks_of(x).end());
      }
      const int64_t gain =
          flow_with_extra_edge(counts, after_holders, num_ranks, floor - 1, -1, -1) - before;
      EXPECT_LE(gain, std::min(room[r], supply[e])) << "seed " << seed;
      ++num_changes;
      num_gain_at_bound += gain > 0 && gain == std::min(room[r], supply[e]);
      return gain == missing;  // the floor drops
    };
    for (RankId r = 0; r < num_ranks; ++r) {
      if (tight.ranks[r]) continue;
      for (int s = 0; s < slots; ++s) {
        const ExpertId f = layout.slots_of(r)[s];
        int64_t f_outside = 0;
        if (f != kEmptySlot) {
          for (RankId h : layout.ranks_of(f)) f_outside += !tight.ranks[h];
        }
        for (ExpertId e = 0; e < layout.num_experts(); ++e) {
          if (!tight.experts[e] || counts[e] == 0) continue;
          std::vector<ExpertId> changed(layout.slots().begin(), layout.slots().end());
          changed[static_cast<size_t>(r) * slots + s] = e;
          // A single change (f keeps a replica) ...
          if (f == kEmptySlot || layout.num_replicas_of(f) > 1) {
            num_lowering += check(changed, e, r);
          }
          // ... and every exchange with a replica of e on a rank a.
          if (f == kEmptySlot) continue;
          for (RankId a : layout.ranks_of(e)) {
            if (layout.holds(a, f)) continue;
            std::vector<ExpertId> traded = changed;
            int num_tight_on_a = 0;
            for (int sa = 0; sa < slots; ++sa) {
              const ExpertId x = layout.slots_of(a)[sa];
              num_tight_on_a += x != kEmptySlot && tight.experts[x];
              if (x == e) traded[static_cast<size_t>(a) * slots + sa] = f;
            }
            if (!check(traded, e, r)) continue;
            ++num_lowering;
            EXPECT_LE(missing + counts[f], (floor - 1) * f_outside) << "seed " << seed;
            EXPECT_GE(num_tight_on_a, 2) << "seed " << seed;
            num_hall_at_limit += missing + counts[f] == (floor - 1) * f_outside;
          }
        }
      }
    }
    ASSERT_NO_THROW(swap_toward_floor_reference(layout, counts, costs, {0.0, 1, 1 << 20, 1 << 20}))
        << "seed " << seed;
    num_reference_rounds += floor > assign::balance_cap(total, num_ranks, 0.0);  // it searched
  }
  EXPECT_GT(num_reference_rounds, 1000);
  EXPECT_GT(num_changes, 10000);
  EXPECT_GT(num_lowering, 100);
  EXPECT_GT(num_gain_at_bound, 100);
  EXPECT_GT(num_hall_at_limit, 0);
}

}  // namespace
}  // namespace cobalt::plan
