// Replica swaps toward a balanceable layout (plan/floor_swaps.hpp): every swap lowers the floor,
// a swap is found exactly when a brute-force search over all single-slot changes and all exchanges
// of two slots finds one (an exchange only when no single change does), a group of two is found
// only where a brute-force search over all pairs of changes finds one, groups lower the floor as
// a whole and make the reference's swaps, the cheapest candidate wins, the target stops it, and
// bad input is refused. The bounds that skip flow checks: swap_search_test.cpp.
#include "cobalt/plan/floor_swaps.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/eval/metrics.hpp"
#include "plan/floor_swaps_testing.hpp"
#include "plan/rank_bound_flow.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::plan {
namespace {

using namespace testing_floor_swaps;

// The fast and reference results agree swap for swap, bit for bit.
void expect_same_result(const FloorSwapResult& fast, const FloorSwapResult& reference,
                        uint64_t seed) {
  ASSERT_EQ(fast.floor_before, reference.floor_before) << "seed " << seed;
  ASSERT_EQ(fast.floor_after, reference.floor_after) << "seed " << seed;
  ASSERT_EQ(fast.swaps.size(), reference.swaps.size()) << "seed " << seed;
  for (size_t i = 0; i < fast.swaps.size(); ++i) {
    const ReplicaSwap &a = fast.swaps[i], &b = reference.swaps[i];
    ASSERT_EQ(a.rank, b.rank) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.slot, b.slot) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.added, b.added) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.removed, b.removed) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.floor_after, b.floor_after) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.exchange_rank, b.exchange_rank) << "seed " << seed << " swap " << i;
    ASSERT_EQ(a.exchange_slot, b.exchange_slot) << "seed " << seed << " swap " << i;
  }
  ASSERT_EQ(fast.layout, reference.layout) << "seed " << seed;
}

// Every single slot change of `layout`, applied: an expert not yet on the rank replacing an empty
// slot or a replica whose expert keeps another one.
std::vector<ExpertLayout> single_changes(const ExpertLayout& layout) {
  std::vector<ExpertLayout> changed_layouts;
  const int slots = layout.slots_per_rank();
  for (RankId r = 0; r < layout.num_ranks(); ++r) {
    for (int s = 0; s < slots; ++s) {
      const ExpertId f = layout.slots_of(r)[s];
      if (f != kEmptySlot && layout.num_replicas_of(f) < 2) continue;
      for (ExpertId e = 0; e < layout.num_experts(); ++e) {
        if (layout.holds(r, e)) continue;
        std::vector<ExpertId> changed(layout.slots().begin(), layout.slots().end());
        changed[static_cast<size_t>(r) * slots + s] = e;
        changed_layouts.emplace_back(layout.topology(), layout.num_experts(), slots, changed);
      }
    }
  }
  return changed_layouts;
}

// The lowest floor any single slot change reaches, by trying every one.
int64_t best_single_change(const ExpertLayout& layout, const std::vector<int64_t>& counts) {
  int64_t best = eval::min_max_rank_load(counts, layout);
  for (const ExpertLayout& candidate : single_changes(layout)) {
    best = std::min(best, eval::min_max_rank_load(counts, candidate));
  }
  return best;
}

// The lowest floor any exchange reaches: the replicas of two experts e (rank a) and f (rank r)
// trade slots (e not on r, f not on a), by trying every one.
int64_t best_exchange(const ExpertLayout& layout, const std::vector<int64_t>& counts) {
  int64_t best = eval::min_max_rank_load(counts, layout);
  const int slots = layout.slots_per_rank();
  for (RankId r = 0; r < layout.num_ranks(); ++r) {
    for (int s = 0; s < slots; ++s) {
      const ExpertId f = layout.slots_of(r)[s];
      if (f == kEmptySlot) continue;
      for (RankId a = 0; a < layout.num_ranks(); ++a) {
        for (int sa = 0; sa < slots; ++sa) {
          const ExpertId e = layout.slots_of(a)[sa];
          if (e == kEmptySlot || e == f || layout.holds(r, e) || layout.holds(a, f)) continue;
          std::vector<ExpertId> changed(layout.slots().begin(), layout.slots().end());
          changed[static_cast<size_t>(r) * slots + s] = e;
          changed[static_cast<size_t>(a) * slots + sa] = f;
          const ExpertLayout candidate(layout.topology(), layout.num_experts(), slots, changed);
          best = std::min(best, eval::min_max_rank_load(counts, candidate));
        }
      }
    }
  }
  return best;
}

// The lowest floor any two single slot changes in a row reach, by trying every pair.
int64_t best_pair_of_changes(const ExpertLayout& layout, const std::vector<int64_t>& counts) {
  int64_t best = eval::min_max_rank_load(counts, layout);
  for (const ExpertLayout& first : single_changes(layout)) {
    best = std::min(best, best_single_change(first, counts));
  }
  return best;
}

TEST(FloorSwaps, FindsASwapExactlyWhenOneLowersTheFloor) {
  int num_found = 0, num_none = 0, num_exchanges = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SplitMix64 rng(seed * 7919);
    const auto [topo, layout, counts, costs] = small_instance(seed, rng, 3, 3, 3);
    const auto result = swap_toward_floor(layout, counts, costs, {0.0, 1, 1 << 20, 1 << 20});
    const int64_t floor = eval::min_max_rank_load(counts, layout);
    ASSERT_EQ(result.floor_before, floor) << "seed " << seed;
    const int64_t best = best_single_change(layout, counts);
    const int64_t best_traded = best_exchange(layout, counts);
    if (best < floor) {
      ASSERT_EQ(result.swaps.size(), 1u) << "seed " << seed;
      ASSERT_FALSE(result.swaps[0].is_exchange()) << "seed " << seed;
      ++num_found;
    } else if (best_traded < floor) {
      ASSERT_EQ(result.swaps.size(), 1u) << "seed " << seed;
      ASSERT_TRUE(result.swaps[0].is_exchange()) << "seed " << seed;
      ++num_exchanges;
    } else {
      ASSERT_TRUE(result.swaps.empty()) << "seed " << seed;
      ASSERT_EQ(result.layout, layout);
      ++num_none;
    }
    ASSERT_EQ(result.floor_after, eval::min_max_rank_load(counts, result.layout));
  }
  EXPECT_GT(num_found, 30);
  EXPECT_GT(num_none, 30);
  EXPECT_GT(num_exchanges, 0);
}

// One node of three ranks, full: no single change helps (expert 3's 13 tasks would stay on one
// rank), nor does any exchange with an expert of a single replica; expert 0 (rank 0) trading
// places with expert 3's replica on rank 1 balances all three ranks at 10.
TEST(FloorSwaps, ExchangesATightExpertWithAReplicatedOne) {
  const Topology topo(1, 3);
  const ExpertLayout layout =
      ExpertLayout::from_rank_lists(topo, 8, 3, {{0, 1, 2}, {3, 4, 5}, {3, 6, 7}});
  const std::vector<int64_t> counts{6, 1, 4, 13, 2, 2, 1, 1};
  const std::vector<double> costs(8, 0.0);
  ASSERT_EQ(eval::min_max_rank_load(counts, layout), 11);
  ASSERT_EQ(best_single_change(layout, counts), 11);
  for (const auto& result :
       {swap_toward_floor(layout, counts, costs, {0.0, 4, 1 << 20, 1 << 20}),
        swap_toward_floor_reference(layout, counts, costs, {0.0, 4, 1 << 20, 1 << 20})}) {
    ASSERT_EQ(result.swaps.size(), 1u);
    const ReplicaSwap& swap = result.swaps[0];
    EXPECT_TRUE(swap.is_exchange());
    EXPECT_EQ(swap.rank, 1);
    EXPECT_EQ(swap.removed, 3);
    EXPECT_EQ(swap.added, 0);
    EXPECT_EQ(swap.exchange_rank, 0);
    EXPECT_EQ(result.floor_after, 10);
    EXPECT_EQ(result.layout.num_replicas_of(3), 2);
  }
}

TEST(FloorSwaps, EverySwapLowersTheFloorAndKeepsTheLayoutValid) {
  int num_swaps = 0, num_exchanges = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed * 31337);
    const Topology topo(4, 16);
    const int slots = 4;
    // Odd seeds: room for replicas; even seeds: every slot holds a single replica but a few, so
    // the floor moves only by exchanges.
    const int experts = seed % 2 == 1 ? 40 : 60;  // of 64 slots
    const auto layout =
        testing::random_layout(seed, topo, experts, slots, seed % 2 == 1 ? 0.9 : 0.0);
    const auto counts = random_counts(rng, experts, 200);
    const auto costs = random_costs(rng, topo.num_nodes(), experts);
    const FloorSwapOptions options{0.05, 6, 64};
    const auto result = swap_toward_floor(layout, counts, costs, options);
    // Replay the swaps one by one: each changes one slot as recorded and lowers the floor.
    std::vector<ExpertId> slots_now(layout.slots().begin(), layout.slots().end());
    int64_t floor = result.floor_before;
    for (const ReplicaSwap& swap : result.swaps) {
      ASSERT_EQ(slots_now[static_cast<size_t>(swap.rank) * slots + swap.slot], swap.removed);
      ASSERT_NE(swap.added, swap.removed);
      if (swap.is_exchange()) {
        ASSERT_EQ(slots_now[static_cast<size_t>(swap.exchange_rank) * slots + swap.exchange_slot],
                  swap.added);
        ++num_exchanges;
      }
      apply_swap(swap, slots, slots_now);
      // The constructor validates: no rank holds an expert twice, every expert keeps a replica.
      const ExpertLayout step(topo, experts, slots, slots_now);
      const int64_t next = eval::min_max_rank_load(counts, step);
      ASSERT_LT(next, floor) << "seed " << seed;
      ASSERT_EQ(swap.floor_after, next) << "seed " << seed;
      floor = next;
      ++num_swaps;
    }
    ASSERT_EQ(std::vector<ExpertId>(result.layout.slots().begin(), result.layout.slots().end()),
              slots_now);
    ASSERT_EQ(result.floor_after, floor);
    ASSERT_LE(static_cast<int>(result.swaps.size()), options.max_swaps);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t target = assign::balance_cap(total, 16, 0.05);
    // Fewer swaps than allowed: the target was met or no single swap lowers the floor further.
    if (static_cast<int>(result.swaps.size()) < options.max_swaps && result.floor_after > target) {
      ASSERT_EQ(best_single_change(result.layout, counts), result.floor_after) << "seed " << seed;
    }
    // Deterministic.
    const auto again = swap_toward_floor(layout, counts, costs, options);
    ASSERT_EQ(again.layout, result.layout);
  }
  EXPECT_GT(num_swaps, 60);
  EXPECT_GT(num_exchanges, 10);
}

TEST(FloorSwaps, WarmStartedFlowsMakeTheReferenceSwaps) {
  int num_swaps = 0, num_exchanges = 0, num_in_groups = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SplitMix64 rng(seed * 2654435761ULL);
    const int nodes = 1 + static_cast<int>(rng.below(8)),
              per_node = 1 + static_cast<int>(rng.below(8));
    const Topology topo(nodes, nodes * per_node);
    const int slots = 1 + static_cast<int>(rng.below(4));
    // Every third instance nearly full of single replicas, where exchanges are the only moves.
    const int max_experts = topo.num_ranks() * slots;
    const int experts = seed % 3 == 0 ? std::max(1, max_experts - static_cast<int>(rng.below(3)))
                                      : 1 + static_cast<int>(rng.below(max_experts));
    const auto layout = testing::random_layout(seed, topo, experts, slots, 0.85);
    const auto counts = random_counts(rng, experts, 1 + static_cast<int64_t>(rng.below(500)));
    const auto costs = random_costs(rng, nodes, experts);
    const FloorSwapOptions options{0.01 * static_cast<double>(rng.below(11)),
                                   static_cast<int>(rng.below(7)),
                                   1 + static_cast<int>(rng.below(80)),
                                   static_cast<int>(rng.below(80)), static_cast<int>(rng.below(5))};
    const auto fast = swap_toward_floor(layout, counts, costs, options);
    const auto reference = swap_toward_floor_reference(layout, counts, costs, options);
    ASSERT_NO_FATAL_FAILURE(expect_same_result(fast, reference, seed));
    for (size_t i = 0; i < fast.swaps.size(); ++i) {
      num_exchanges += fast.swaps[i].is_exchange();
      // A group's swaps before its last keep the floor.
      const int64_t previous = i == 0 ? fast.floor_before : fast.swaps[i - 1].floor_after;
      num_in_groups += fast.swaps[i].floor_after == previous;
    }
    num_swaps += static_cast<int>(fast.swaps.size());
  }
  EXPECT_GT(num_swaps, 100);
  EXPECT_GT(num_exchanges, 10);
  EXPECT_GE(num_in_groups, 3);
}

// Groups (step 5) against brute force on small layouts where no single change or exchange lowers
// the floor: a group of two is found only where some pair of changes lowers it, and then lowers
// the floor as far as its second swap says.
TEST(FloorSwaps, FindsAGroupOfTwoOnlyWhereAPairLowersTheFloor) {
  int num_pairs = 0, num_found = 0, num_no_pair = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    SplitMix64 rng(seed * 104729);
    const auto [topo, layout, counts, costs] = small_instance(seed, rng, 2, 2, 3);
    const int64_t floor = eval::min_max_rank_load(counts, layout);
    if (best_single_change(layout, counts) < floor || best_exchange(layout, counts) < floor) {
      continue;
    }
    const FloorSwapOptions options{0.0, 2, 1 << 20, 1 << 20, 2};
    const auto result = swap_toward_floor(layout, counts, costs, options);
    const auto reference = swap_toward_floor_reference(layout, counts, costs, options);
    ASSERT_EQ(result.layout, reference.layout) << "seed " << seed;
    ASSERT_EQ(result.floor_after, eval::min_max_rank_load(counts, result.layout));
    if (best_pair_of_changes(layout, counts) < floor) {
      ++num_pairs;
      if (!result.swaps.empty()) {
        ASSERT_EQ(result.swaps.size(), 2u) << "seed " << seed;
        ASSERT_EQ(result.swaps[0].floor_after, floor) << "seed " << seed;
        ASSERT_LT(result.floor_after, floor) << "seed " << seed;
        ASSERT_EQ(result.swaps[1].floor_after, result.floor_after) << "seed " << seed;
        ++num_found;
      }
    } else {
      ASSERT_TRUE(result.swaps.empty()) << "seed " << seed;
      ASSERT_EQ(result.layout, layout) << "seed " << seed;
      ++num_no_pair;
    }
  }
  // Groups find few of these pairs (2 of 23 at this writing): on layouts this small most pairs
  // that lower the floor first move a replica that is not tight out of the way (a relocation),
  // which a group, made of replicas of tight experts only, does not try; and each of its swaps
  // must lower the shortfall on its own. The counts keep both branches exercised.
  EXPECT_GE(num_pairs, 20);
  EXPECT_GE(num_found, 1);
  EXPECT_GE(num_no_pair, 100);
}

// Two nodes of two ranks, 3 slots each (a layout from the random search above). Experts 6 (30
// tasks, only on rank 2) and 3 (29, only on rank 3) with their neighbours keep ranks 2 and 3 at
// 38: no single change or exchange lowers that, and each of 6 and 3 would need a rank of its
// own. The group puts 6 and then 3 on rank 0 in place of its duplicates of 1 and 2: floor 30.
TEST(FloorSwaps, AGroupOfTwoWhereNoSingleSwapHelps) {
  const Topology topo(2, 4);
  const ExpertLayout layout(topo, 9, 3, {1, 2, 5, 8, 2, 1, 6, 5, 7, 0, 4, 3});
  const std::vector<int64_t> counts{8, 10, 4, 29, 1, 12, 30, 8, 4};
  const std::vector<double> costs{31, 17, 40, 56, 63, 73, 25, 52, 66,
                                  13, 73, 23, 41, 39, 6,  44, 20, 97};
  ASSERT_EQ(eval::min_max_rank_load(counts, layout), 38);
  ASSERT_EQ(best_single_change(layout, counts), 38);
  ASSERT_EQ(best_exchange(layout, counts), 38);
  const FloorSwapOptions options{0.0, 2, 1 << 20, 1 << 20, 2};
  for (const auto& result : {swap_toward_floor(layout, counts, costs, options),
                             swap_toward_floor_reference(layout, counts, costs, options)}) {
    ASSERT_EQ(result.swaps.size(), 2u);
    EXPECT_EQ(result.swaps[0].rank, 0);
    EXPECT_EQ(result.swaps[0].removed, 1);
    EXPECT_EQ(result.swaps[0].added, 6);
    EXPECT_EQ(result.swaps[0].floor_after, 38);  // kept: the group's first swap
    EXPECT_EQ(result.swaps[1].rank, 0);
    EXPECT_EQ(result.swaps[1].removed, 2);
    EXPECT_EQ(result.swaps[1].added, 3);
    EXPECT_EQ(result.swaps[1].floor_after, 30);
    EXPECT_EQ(result.floor_after, 30);
    EXPECT_EQ(eval::min_max_rank_load(counts, result.layout), 30);
  }
  // Without groups, or with room for one swap only, nothing.
  EXPECT_TRUE(
      swap_toward_floor(layout, counts, costs, {0.0, 2, 1 << 20, 1 << 20, 0}).swaps.empty());
  const auto one_left = swap_toward_floor(layout, counts, costs, {0.0, 1, 1 << 20, 1 << 20, 2});
  EXPECT_TRUE(one_left.swaps.empty());
  EXPECT_EQ(one_left.layout, layout);
}

// On larger layouts, groups of up to 3: replaying the swaps, each records the floor after it,
// no swap raises the floor, a run of swaps that keep it is shorter than a group and ends in one
// that lowers it, and the result starts with the swaps made without groups and ends no higher.
TEST(FloorSwaps, GroupsLowerTheFloorAsAWhole) {
  int num_groups = 0, num_stopped_after_swaps = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    SplitMix64 rng(seed * 6700417);
    const Topology topo(4, 16);
    const int slots = 3;
    const int experts = 24 + static_cast<int>(rng.below(20));  // of 48 slots
    const auto layout = testing::random_layout(seed, topo, experts, slots, 0.9);
    const auto counts = random_counts(rng, experts, 200);
    const auto costs = random_costs(rng, topo.num_nodes(), experts);
    const FloorSwapOptions with_groups{0.0, 12, 256, 64, 3};
    const FloorSwapOptions without_groups{0.0, 12, 256, 64, 0};
    const auto result = swap_toward_floor(layout, counts, costs, with_groups);
    const auto plain = swap_toward_floor(layout, counts, costs, without_groups);
    // The reference (fresh flows, every candidate measured, no bounds) makes the same swaps.
    const auto reference = swap_toward_floor_reference(layout, counts, costs, with_groups);
    ASSERT_NO_FATAL_FAILURE(expect_same_result(result, reference, seed));
    std::vector<ExpertId> slots_now(layout.slots().begin(), layout.slots().end());
    int64_t floor = result.floor_before;
    int kept_in_a_row = 0;
    for (size_t i = 0; i < result.swaps.size(); ++i) {
      const ReplicaSwap& swap = result.swaps[i];
      if (i < plain.swaps.size()) {
        ASSERT_EQ(swap.rank, plain.swaps[i].rank) << "seed " << seed;
        ASSERT_EQ(swap.slot, plain.swaps[i].slot) << "seed " << seed;
        ASSERT_EQ(swap.added, plain.swaps[i].added) << "seed " << seed;
      }
      apply_swap(swap, slots, slots_now);
      const ExpertLayout step(topo, experts, slots, slots_now);
      const int64_t next = eval::min_max_rank_load(counts, step);
      ASSERT_EQ(swap.floor_after, next) << "seed " << seed;
      ASSERT_LE(next, floor) << "seed " << seed;
      if (next == floor) {
        ASSERT_FALSE(swap.is_exchange()) << "seed " << seed;
        ASSERT_LT(++kept_in_a_row, with_groups.max_group_swaps) << "seed " << seed;
      } else {
        num_groups += kept_in_a_row > 0;
        kept_in_a_row = 0;
      }
      floor = next;
    }
    ASSERT_EQ(kept_in_a_row, 0) << "seed " << seed;  // the last group closed
    // The result is the swaps replayed: a dropped group left no slot behind.
    ASSERT_EQ(std::vector<ExpertId>(result.layout.slots().begin(), result.layout.slots().end()),
              slots_now)
        << "seed " << seed;
    ASSERT_EQ(result.floor_after, floor) << "seed " << seed;
    // Stopped above the target with room for a group: a group search found none (and any it
    // tried on was dropped).
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    num_stopped_after_swaps += !result.swaps.empty() &&
                               result.floor_after > assign::balance_cap(total, 16, 0.0) &&
                               static_cast<int>(result.swaps.size()) + 2 <= with_groups.max_swaps;
    ASSERT_LE(static_cast<int>(result.swaps.size()), with_groups.max_swaps);
    ASSERT_LE(result.floor_after, plain.floor_after) << "seed " << seed;
    ASSERT_GE(result.swaps.size(), plain.swaps.size()) << "seed " << seed;
  }
  EXPECT_GE(num_groups, 8);
  EXPECT_GE(num_stopped_after_swaps, 2);
}

// Two nodes of two ranks; expert 0 (40 tasks against a mean of 14) alone on rank 0, every other
// expert light. Candidates: a replica of 0 in place of a replica on ranks 1-3.
TEST(FloorSwaps, TheCheapestReplicaMakesRoom) {
  const Topology topo(2, 4);
  const std::vector<int64_t> counts = {40, 4, 4, 4, 4};
  // Ranks: 0 {0, 3}, 1 {1, 2}, 2 {2, 3}, 3 {1, 4}: no expert has two replicas on one node, so
  // every candidate takes an expert's last replica off its node and pays removal_cost.
  const ExpertLayout layout(topo, 5, 2, {0, 3, 1, 2, 2, 3, 1, 4});
  std::vector<double> costs(2 * 5, 50.0);
  costs[1 * 5 + 3] = 2;  // expert 3 off node 1 (rank 2, slot 1) is the cheapest
  auto result = swap_toward_floor(layout, counts, costs, {0.0, 1, 64});
  ASSERT_EQ(result.swaps.size(), 1u);
  EXPECT_EQ(result.swaps[0].rank, 2);
  EXPECT_EQ(result.swaps[0].slot, 1);
  EXPECT_EQ(result.swaps[0].removed, 3);
  EXPECT_EQ(result.swaps[0].added, 0);
  EXPECT_EQ(result.floor_before, 40);
  EXPECT_LT(result.floor_after, 40);
  // Equal prices: the copy within node 0 (rank 1, expert 2's slot) before the one across nodes.
  costs[0 * 5 + 2] = 2;
  result = swap_toward_floor(layout, counts, costs, {0.0, 1, 64});
  ASSERT_EQ(result.swaps.size(), 1u);
  EXPECT_EQ(result.swaps[0].rank, 1);
  EXPECT_EQ(result.swaps[0].removed, 2);
  // A replica whose expert keeps another on the same node costs nothing: with rank 3 holding
  // {2, 4}, expert 2 is on ranks 2 and 3 of node 1, so taking it off rank 2 or 3 is free.
  const ExpertLayout twice(topo, 5, 2, {0, 3, 1, 2, 2, 3, 2, 4});
  std::vector<double> dear(2 * 5, 50.0);
  result = swap_toward_floor(twice, counts, dear, {0.0, 1, 64});
  ASSERT_EQ(result.swaps.size(), 1u);
  EXPECT_EQ(result.swaps[0].removed, 2);
  EXPECT_EQ(result.swaps[0].rank, 2);  // ranks 2 and 3 tie; the lower first
}

TEST(FloorSwaps, StopsAtTheTarget) {
  const Topology topo(1, 2);
  const ExpertLayout layout(topo, 3, 2, {0, 1, 2, kEmptySlot});
  const std::vector<double> costs(3, 0.0);
  // Loads 10 / 10 + 1: floor 11 of mean 10.5 — within 5%, so nothing to do at tolerance 0.05.
  const auto within =
      swap_toward_floor(layout, std::vector<int64_t>{10, 1, 10}, costs, {0.05, 4, 64});
  EXPECT_TRUE(within.swaps.empty());
  EXPECT_EQ(within.floor_before, 11);
  // 30 on expert 0 alone: floor 30 of mean 20.5 — a replica of 0 in the free slot fixes it.
  const auto above =
      swap_toward_floor(layout, std::vector<int64_t>{30, 1, 10}, costs, {0.05, 4, 64});
  ASSERT_EQ(above.swaps.size(), 1u);
  EXPECT_EQ(above.swaps[0].added, 0);
  EXPECT_EQ(above.floor_after, 21);
  // No tasks: nothing to balance.
  EXPECT_TRUE(
      swap_toward_floor(layout, std::vector<int64_t>{0, 0, 0}, costs, {0.0, 4, 64}).swaps.empty());
  EXPECT_TRUE(swap_toward_floor(layout, std::vector<int64_t>{30, 1, 10}, costs, {0.05, 0, 64})
                  .swaps.empty());
}

TEST(FloorSwaps, ExtremeCountsAndTolerances) {
  // Counts up to the documented 2^52 in all: the warm-started flow routes them like the reference.
  const Topology topo(1, 2);
  const ExpertLayout layout(topo, 2, 2, {0, 1, kEmptySlot, kEmptySlot});
  const std::vector<double> costs(2, 0.0);
  const std::vector<int64_t> huge = {(int64_t{1} << 52) - 5, 5};
  const auto fast = swap_toward_floor(layout, huge, costs, {0.0, 1, 64});
  const auto reference = swap_toward_floor_reference(layout, huge, costs, {0.0, 1, 64});
  EXPECT_EQ(fast.floor_before, int64_t{1} << 52);  // both experts on rank 0
  EXPECT_EQ(fast.floor_after, int64_t{1} << 51);
  EXPECT_EQ(fast.floor_after, reference.floor_after);
  ASSERT_EQ(fast.swaps.size(), 1u);
  EXPECT_EQ(fast.layout, reference.layout);
  // A tolerance whose cap passes every load: nothing to do (the cap saturates, no overflow).
  const std::vector<int64_t> skewed = {30, 1};
  EXPECT_TRUE(swap_toward_floor(layout, skewed, costs, {1e300, 4, 64}).swaps.empty());
  EXPECT_TRUE(swap_toward_floor_reference(layout, skewed, costs, {1e300, 4, 64}).swaps.empty());
}

TEST(FloorSwaps, RejectsBadInput) {
  const Topology topo(2, 4);
  const auto layout = ExpertLayout::static_ep(topo, 4, 2);
  const std::vector<int64_t> counts = {1, 2, 3, 4};
  const std::vector<double> costs(8, 0.0);
  const auto code_of = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, std::vector<int64_t>{1, 2}, costs);
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { swap_toward_floor(layout, counts, std::vector<double>(4, 0.0)); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, std::vector<int64_t>{1, -2, 3, 4}, costs);
            }),
            ErrorCode::kInvalidArgument);
  std::vector<double> bad_costs = costs;
  bad_costs[3] = std::nan("");
  EXPECT_EQ(code_of([&] { swap_toward_floor(layout, counts, bad_costs); }),
            ErrorCode::kInvalidArgument);
  bad_costs[3] = -1;
  EXPECT_EQ(code_of([&] { swap_toward_floor(layout, counts, bad_costs); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, counts, costs, {-0.1, 1, 64});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, counts, costs, {0.05, -1, 64});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, counts, costs, {0.05, 1, 0});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, counts, costs, {0.05, 1, 64, -1});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              swap_toward_floor(layout, counts, costs, {0.05, 1, 64, 0, -1});
            }),
            ErrorCode::kInvalidArgument);
}

// A shortfall of exactly floor - 1 can be closed by one swap: 2 ranks, expert 0 with 2 tasks
// alone on rank 0, rank 1 empty. Floor 2, target 1; the free slot on rank 1 lowers it to 1.
TEST(FloorSwaps, AShortfallOfFloorMinusOneIsClosedByOneSwap) {
  const ExpertLayout layout(Topology(1, 2), 1, 2, {0, kEmptySlot, kEmptySlot, kEmptySlot});
  const std::vector<int64_t> counts = {2};
  const std::vector<double> removal_cost(1, 0.0);
  FloorSwapOptions options;
  options.tolerance = 0;
  const auto fast = swap_toward_floor(layout, counts, removal_cost, options);
  const auto reference = swap_toward_floor_reference(layout, counts, removal_cost, options);
  EXPECT_EQ(reference.floor_after, 1);
  EXPECT_EQ(fast.floor_after, reference.floor_after);
  EXPECT_EQ(fast.swaps.size(), reference.swaps.size());
}

}  // namespace
}  // namespace cobalt::plan
