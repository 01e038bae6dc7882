// The ordered mask table (Algorithm 1, step 1 for N <= 8) against brute force: the cover is drawn
// among the remote node masks with the fewest nodes that meet every expert not on the source node
// (in value order, by the token's cover hash); the select table against a bit loop.
#include "assign/ordered_mask_table.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::assign::detail {
namespace {

// The feasible remote masks with the fewest nodes, in value order.
std::vector<uint64_t> brute_force_minimum_covers(const std::vector<uint64_t>& masks, int num_nodes,
                                                 int src_node) {
  std::vector<uint64_t> minimum;
  int best_count = num_nodes + 1;
  for (uint64_t b = 0; b < (uint64_t{1} << num_nodes); ++b) {
    if (b >> src_node & 1) continue;
    bool feasible = true;
    for (uint64_t m : masks) feasible = feasible && ((m >> src_node & 1) || (m & b) != 0);
    if (!feasible || std::popcount(b) > best_count) continue;
    if (std::popcount(b) < best_count) minimum.clear();
    best_count = std::popcount(b);
    minimum.push_back(b);
  }
  return minimum;
}

TEST(OrderedMaskTable, DrawnCoverIsTheBruteForceDrawAmongMinimalMasks) {
  SplitMix64 rng(17);
  int64_t num_tied = 0;
  for (int num_nodes = 1; num_nodes <= OrderedMaskTable::kMaxNodes; ++num_nodes) {
    const OrderedMaskTable table(num_nodes);
    EXPECT_EQ(table.num_words(), std::max(1, (1 << num_nodes) / 64));
    const uint64_t all = (uint64_t{1} << num_nodes) - 1;
    for (int trial = 0; trial < 400; ++trial) {
      const int src_node = static_cast<int>(rng.below(num_nodes));
      std::vector<uint64_t> masks(1 + rng.below(16));
      const int density = 1 + static_cast<int>(rng.below(3));  // sparse to dense layouts
      for (uint64_t& m : masks) {
        m = 0;
        while (m == 0) {
          for (int d = 0; d < density; ++d) m |= uint64_t{1} << rng.below(num_nodes);
          m &= all;
        }
      }
      const uint64_t token_h = rng.next();
      const auto minimum = brute_force_minimum_covers(masks, num_nodes, src_node);
      num_tied += minimum.size() > 1 ? 1 : 0;
      const uint64_t expected = minimum[uniform_below(cover_hash_from_token(token_h),
                                                      static_cast<uint32_t>(minimum.size()))];
      ASSERT_EQ(table.drawn_cover(masks.data(), static_cast<int>(masks.size()), src_node, token_h),
                expected)
          << "N " << num_nodes << " trial " << trial;
    }
  }
  EXPECT_GT(num_tied, 500);  // the draw was exercised, not only unique minima
}

TEST(OrderedMaskTable, PopcountClassesPartitionThePositions) {
  for (int num_nodes = 1; num_nodes <= OrderedMaskTable::kMaxNodes; ++num_nodes) {
    const OrderedMaskTable table(num_nodes);
    for (int position = 0; position < (1 << num_nodes); ++position) {
      const int popcount = std::popcount(table.mask_at(position));
      for (int p = 0; p <= num_nodes; ++p) {
        const bool in_class = (table.popcount_class(p)[position / 64] >> (position % 64)) & 1;
        EXPECT_EQ(in_class, p == popcount) << num_nodes << " " << position << " " << p;
      }
    }
  }
}

TEST(OrderedMaskTable, AllLocalIsTheEmptyCoverAndBadSizesThrow) {
  const OrderedMaskTable table(3);
  const std::vector<uint64_t> local = {0b010, 0b111, 0b110};
  EXPECT_EQ(table.drawn_cover(local.data(), 3, 1, 99), 0u);
  EXPECT_EQ(table.drawn_cover(local.data(), 0, 2, 99), 0u);
  const std::vector<uint64_t> split = {0b001, 0b100};  // source node 1 holds neither
  EXPECT_EQ(table.drawn_cover(split.data(), 2, 1, 99), 0b101u);
  EXPECT_THROW(OrderedMaskTable(0), Error);
  EXPECT_THROW(OrderedMaskTable(9), Error);
}

TEST(SelectTable, MatchesABitLoopForEveryByte) {
  const SelectTable select;
  for (uint64_t byte = 1; byte < 256; ++byte) {
    uint64_t rest = byte;
    for (uint32_t i = 0; i < static_cast<uint32_t>(std::popcount(byte)); ++i) {
      ASSERT_EQ(select.nth_set_bit(byte, i), std::countr_zero(rest)) << byte << " " << i;
      rest &= rest - 1;
    }
  }
}

}  // namespace
}  // namespace cobalt::assign::detail
