// The dispatch layout against its definitions: by hand on a small case, and the fast pass against
// the simple reference on random assignments (repeated ranks within a token included).
#include "cobalt/assign/dispatch_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::assign {
namespace {

void expect_same(const DispatchLayout& a, const DispatchLayout& b) {
  EXPECT_EQ(a.rank_counts, b.rank_counts);
  EXPECT_EQ(a.node_counts, b.node_counts);
  EXPECT_EQ(a.rank_offsets, b.rank_offsets);
  EXPECT_EQ(a.pair_counts, b.pair_counts);
  EXPECT_EQ(a.token_in_rank, b.token_in_rank);
  EXPECT_EQ(a.slot, b.slot);
}

TEST(DispatchLayout, SmallCaseByHand) {
  // 2 nodes x 2 ranks, K = 3. Token 0 from rank 0 runs on ranks 1, 1, 2; token 1 from rank 3 on
  // ranks 2, 0, 2.
  const Topology topo(2, 4);
  const std::vector<RankId> exec{1, 1, 2, 2, 0, 2};
  const std::vector<RankId> src{0, 3};
  for (const auto& d :
       {dispatch_layout(exec, src, 3, topo), dispatch_layout_reference(exec, src, 3, topo)}) {
    EXPECT_EQ(d.rank_counts, (std::vector<int64_t>{1, 1, 2, 0}));
    EXPECT_EQ(d.node_counts, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(d.rank_offsets, (std::vector<int64_t>{0, 1, 2, 4, 4}));
    EXPECT_EQ(d.token_in_rank, (std::vector<uint8_t>{0, 1, 1, 0, 1, 0, 1, 0}));
    // Send rows: rank 0 [token 1], rank 1 [token 0], rank 2 [token 0, token 1].
    EXPECT_EQ(d.slot, (std::vector<int32_t>{1, 1, 2, 3, 0, 3}));
    std::vector<int64_t> pairs(16, 0);
    pairs[0 * 4 + 1] = pairs[0 * 4 + 2] = 1;
    pairs[3 * 4 + 0] = pairs[3 * 4 + 2] = 1;
    EXPECT_EQ(d.pair_counts, pairs);
  }
}

TEST(DispatchLayout, MatchesTheReferenceOnRandomAssignments) {
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SplitMix64 rng(seed);
    // Up to 64 nodes (the node set is a 64-bit mask); some batches empty.
    const int nodes = seed % 10 == 0 ? 64 : 1 + static_cast<int>(rng.below(8)),
              per_node = 1 + static_cast<int>(rng.below(5));
    const Topology topo(nodes, nodes * per_node);
    const int top_k = 1 + static_cast<int>(rng.below(10));
    const int64_t num_tokens = seed % 25 == 0 ? 0 : static_cast<int64_t>(rng.below(300));
    // Few distinct ranks per token half of the time: repeated ranks within a row are common.
    const int spread = rng.below(2) ? topo.num_ranks() : std::min(2, topo.num_ranks());
    std::vector<RankId> exec(num_tokens * top_k), src(num_tokens);
    for (auto& s : src) s = static_cast<RankId>(rng.below(topo.num_ranks()));
    for (int64_t t = 0; t < num_tokens; ++t) {
      const RankId base = static_cast<RankId>(rng.below(topo.num_ranks()));
      for (int k = 0; k < top_k; ++k) {
        exec[t * top_k + k] = static_cast<RankId>((base + rng.below(spread)) % topo.num_ranks());
      }
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_same(dispatch_layout(exec, src, top_k, topo),
                dispatch_layout_reference(exec, src, top_k, topo));
  }
}

// One DispatchLayout reused across batches of other sizes and topologies (as a runtime keeps one
// per layer): poisoned before every call, it must come out equal to the reference, so every entry
// is written. A bad input leaves it as it was.
TEST(DispatchLayout, ReusedOutputIsFullyOverwritten) {
  DispatchLayout out;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed * 7919);
    // Both sides of the 64-rank bit-mask rows (8 x 8 = 64, 9 x 8 = 72), more than 8 nodes within
    // 64 ranks (16 x 4, 32 x 2, 64 x 1), small and odd sizes.
    static constexpr int kShapes[][2] = {{8, 8}, {9, 8}, {16, 4}, {32, 2}, {64, 1}, {3, 7}};
    const bool fixed_shape = rng.below(2) != 0;
    const auto& shape = kShapes[rng.below(6)];
    const int nodes = fixed_shape ? shape[0] : 1 + static_cast<int>(rng.below(6)),
              per_node = fixed_shape ? shape[1] : 1 + static_cast<int>(rng.below(7));
    const Topology topo(nodes, nodes * per_node);
    const int top_k = 1 + static_cast<int>(rng.below(9));
    const int64_t num_tokens = static_cast<int64_t>(rng.below(200));
    std::vector<RankId> exec(num_tokens * top_k), src(num_tokens);
    for (auto& s : src) s = static_cast<RankId>(rng.below(topo.num_ranks()));
    for (auto& d : exec) d = static_cast<RankId>(rng.below(topo.num_ranks()));
    std::fill(out.token_in_rank.begin(), out.token_in_rank.end(), uint8_t{0xAB});
    std::fill(out.slot.begin(), out.slot.end(), -7);
    std::fill(out.rank_counts.begin(), out.rank_counts.end(), 99);
    std::fill(out.pair_counts.begin(), out.pair_counts.end(), 99);
    std::fill(out.node_counts.begin(), out.node_counts.end(), 99);
    std::fill(out.rank_offsets.begin(), out.rank_offsets.end(), 99);
    SCOPED_TRACE("seed " + std::to_string(seed));
    dispatch_layout(exec, src, top_k, topo, out);
    expect_same(out, dispatch_layout_reference(exec, src, top_k, topo));
    if (num_tokens > 0) {
      const DispatchLayout before = out;
      exec.back() = topo.num_ranks();
      EXPECT_THROW(dispatch_layout(exec, src, top_k, topo, out), Error);
      expect_same(out, before);
    }
  }
}

TEST(DispatchLayout, BadInputNamesTheEntryAndTheRange) {
  const Topology topo(2, 4);
  const auto message = [&](std::vector<RankId> exec, std::vector<RankId> src, int top_k) {
    try {
      dispatch_layout(exec, src, top_k, topo);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 1, 2, 3}, {0, 4}, 2).find("token 1 source rank 4 out of range [0, 4)"),
            std::string::npos);
  EXPECT_NE(message({0, 1, 2, -1}, {0, 1}, 2).find("task (1, 1) rank -1 out of range [0, 4)"),
            std::string::npos);
  EXPECT_NE(message({0, 1, 2}, {0, 1}, 2).find("3 execution ranks for 2 tokens x top-k 2"),
            std::string::npos);
  EXPECT_NE(message({}, {}, 0).find("top-k 0 must be >= 1"), std::string::npos);
  // Both a task of token 0 and the source of token 1 bad: the first in token order is named.
  EXPECT_NE(message({0, -1, 2, 3}, {0, 9}, 2).find("task (0, 1) rank -1"), std::string::npos);
  // The reference checks the same way.
  EXPECT_THROW(
      dispatch_layout_reference(std::vector<RankId>{0, 9}, std::vector<RankId>{0}, 2, topo), Error);
}

}  // namespace
}  // namespace cobalt::assign
