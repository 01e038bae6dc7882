// The subset search's minimum set cover (src/assign/set_cover.hpp): the pruned search against the
// plain enumeration, bit for bit, and its size against brute force.
#include "assign/set_cover.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <vector>

#include "cobalt/core/rng.hpp"

namespace cobalt::assign::detail {
namespace {

int brute_force_size(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover, int num_nodes) {
  int best = num_nodes + 1;
  for (uint64_t pick = 1; pick < (uint64_t{1} << num_nodes); ++pick) {
    uint32_t covered = 0;
    for (uint64_t m = pick; m; m &= m - 1) covered |= cover[std::countr_zero(m)];
    if ((covered & full) == full) best = std::min(best, std::popcount(pick));
  }
  return best;
}

TEST(SetCover, PrunedSearchEqualsTheEnumeration) {
  SetCoverScratch scratch, reference_scratch;
  int num_multi = 0;
  for (uint64_t seed = 1; seed <= 20000; ++seed) {
    SplitMix64 rng(seed);
    const int num_elements = 1 + static_cast<int>(rng.below(16));
    const int num_nodes = 2 + static_cast<int>(rng.below(seed % 4 == 0 ? 63 : 16));
    const uint32_t full = (uint32_t{1} << num_elements) - 1;
    // Each element on 1-3 random nodes (the layouts' replicas), so covers of many sizes occur.
    std::array<uint32_t, kMaxNodes> cover{};
    uint64_t candidates = 0;
    for (int e = 0; e < num_elements; ++e) {
      const int copies = 1 + static_cast<int>(rng.below(3));
      for (int c = 0; c < copies; ++c) {
        const int n = static_cast<int>(rng.below(num_nodes));
        cover[n] |= uint32_t{1} << e;
        candidates |= uint64_t{1} << n;
      }
    }
    const uint64_t fast = min_node_cover(full, cover, candidates, scratch);
    const uint64_t reference = min_node_cover_reference(full, cover, candidates, reference_scratch);
    ASSERT_EQ(fast, reference) << "seed " << seed;
    uint32_t covered = 0;
    for (uint64_t m = fast; m; m &= m - 1) covered |= cover[std::countr_zero(m)];
    ASSERT_EQ(covered & full, full) << "seed " << seed;
    num_multi += std::popcount(fast) >= 3;
    if (num_nodes <= 14) {
      ASSERT_EQ(std::popcount(fast), brute_force_size(full, cover, num_nodes)) << "seed " << seed;
    }
  }
  EXPECT_GT(num_multi, 1000);  // the pruned search is exercised, not only single covers
}

// The fewest of the sets cover[n], n in candidate_nodes, whose union holds `full`: a plain DP over
// the subsets of `full` with every node's raw set (no dominance reduction, no set list), written
// apart from set_cover.cpp. num_nodes + 1 when no cover exists.
int dp_cover_size(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                  uint64_t candidate_nodes, int num_nodes) {
  std::vector<int> fewest(size_t{full} + 1, num_nodes + 1);
  fewest[0] = 0;
  for (uint32_t covered = 0; covered <= full; ++covered) {  // a union only grows: ascending order
    if (fewest[covered] > num_nodes) continue;
    for (int n = 0; n < num_nodes; ++n) {
      if (!(candidate_nodes >> n & 1)) continue;
      const uint32_t next = covered | (cover[n] & full);
      fewest[next] = std::min(fewest[next], fewest[covered] + 1);
    }
  }
  return fewest[full];
}

// Instances whose set lists are longer than 12, where min_cover_of_list leaves the combination
// search for its DP over subsets (PrunedSearchEqualsTheEnumeration reaches it rarely, and its
// reference shares that DP): 8 to 12 elements, 16 to 64 nodes holding 1 to 3 of them each.
TEST(SetCover, LongListsGetAMinimumCoverByAnIndependentDp) {
  SetCoverScratch scratch;
  int num_long_lists = 0;
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    SplitMix64 rng(seed * 7919);
    const int num_elements = 8 + static_cast<int>(rng.below(5));
    const int num_nodes = 16 + static_cast<int>(rng.below(49));
    const uint32_t full = (uint32_t{1} << num_elements) - 1;
    std::array<uint32_t, kMaxNodes> cover{};
    uint64_t candidates = 0;
    for (int n = 0; n < num_nodes; ++n) {
      const int held = 1 + static_cast<int>(rng.below(3));
      for (int i = 0; i < held; ++i) cover[n] |= uint32_t{1} << rng.below(num_elements);
      if (rng.below(8) != 0) candidates |= uint64_t{1} << n;  // some nodes are not candidates
    }
    uint32_t reachable = 0;
    for (int n = 0; n < num_nodes; ++n) {
      if (candidates >> n & 1) reachable |= cover[n];
    }
    if (reachable != full) continue;  // the assignment asks only for covers that exist
    SetList list;
    make_set_list(full, cover, candidates, list);
    num_long_lists += list.size > 12;
    const uint64_t fast = min_node_cover(full, cover, candidates, scratch);
    ASSERT_EQ(fast & ~candidates, 0u) << "seed " << seed;
    uint32_t covered = 0;
    for (uint64_t m = fast; m; m &= m - 1) covered |= cover[std::countr_zero(m)];
    ASSERT_EQ(covered & full, full) << "seed " << seed;
    ASSERT_EQ(std::popcount(fast), dp_cover_size(full, cover, candidates, num_nodes))
        << "seed " << seed << ", " << list.size << " sets";
    bool single = false;
    for (int i = 0; i < list.size; ++i) single |= list.sets[i] == full;
    if (list.size > 12 && !single) {
      // Which minimum cover, by the header's rule (the CUDA kernel follows it too): walking down
      // from `full`, the first set of the list that leads to a remainder one set cheaper.
      std::vector<int> fewest(size_t{full} + 1, 0xff);
      fewest[0] = 0;
      for (uint32_t subset = 1; subset <= full; ++subset) {
        for (int i = 0; i < list.size; ++i) {
          if ((list.sets[i] & subset) == 0) continue;
          fewest[subset] = std::min(fewest[subset], fewest[subset & ~list.sets[i]] + 1);
        }
      }
      uint64_t expected = 0;
      for (uint32_t left = full; left != 0;) {
        for (int i = 0; i < list.size; ++i) {
          if ((list.sets[i] & left) != 0 && fewest[left & ~list.sets[i]] + 1 == fewest[left]) {
            expected |= uint64_t{1} << list.node[i];
            left &= ~list.sets[i];
            break;
          }
        }
      }
      ASSERT_EQ(fast, expected) << "seed " << seed;
    }
  }
  EXPECT_GT(num_long_lists, 500);
}

// The byte-lane construction of the set list against the incremental one: the same sets, the same
// nodes, in the same order, for 1 to 8 uncovered experts on up to 64 nodes (duplicate sets,
// nested sets and nodes holding nothing included). Skipped without AVX-512.
TEST(SetCover, ByteLaneSetListEqualsTheIncrementalOne) {
  if (!set_list_avx512_supported()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/VL/BW";
  int num_dominated = 0;
  for (uint64_t seed = 1; seed <= 20000; ++seed) {
    SplitMix64 rng(seed);
    const int num_uncovered = 1 + static_cast<int>(rng.below(kSetListAvx512MaxElements));
    const int num_nodes = 1 + static_cast<int>(rng.below(seed % 3 == 0 ? 64 : 12));
    std::array<uint64_t, kSetListAvx512MaxElements> masks{};
    for (int e = 0; e < num_uncovered; ++e) {
      const int copies = 1 + static_cast<int>(rng.below(4));
      for (int c = 0; c < copies; ++c) masks[e] |= uint64_t{1} << rng.below(num_nodes);
    }
    std::array<uint32_t, kMaxNodes> cover{};
    uint64_t candidates = 0;
    for (int e = 0; e < num_uncovered; ++e) {
      candidates |= masks[e];
      for (int n = 0; n < num_nodes; ++n) {
        if (masks[e] >> n & 1) cover[n] |= uint32_t{1} << e;
      }
    }
    const uint32_t full = (uint32_t{1} << num_uncovered) - 1;
    SetList incremental;
    make_set_list(full, cover, candidates, incremental);
    SetList lanes;
    lanes.sets.fill(0xdead);  // poisoned: entries past the size are never compared
    make_set_list_avx512(masks.data(), num_uncovered, lanes);
    ASSERT_EQ(lanes.size, incremental.size) << "seed " << seed;
    for (int i = 0; i < incremental.size; ++i) {
      ASSERT_EQ(lanes.sets[i], incremental.sets[i]) << "seed " << seed << " entry " << i;
      ASSERT_EQ(lanes.node[i], incremental.node[i]) << "seed " << seed << " entry " << i;
    }
    num_dominated += incremental.size < std::popcount(candidates);
    SetCoverScratch scratch;
    ASSERT_EQ(min_cover_of_list(lanes, full, scratch),
              min_node_cover(full, cover, candidates, scratch))
        << "seed " << seed;
  }
  EXPECT_GT(num_dominated, 10000);  // duplicates and nested sets are exercised
}

}  // namespace
}  // namespace cobalt::assign::detail
