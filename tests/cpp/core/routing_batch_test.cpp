#include "cobalt/core/routing_batch.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "core/topk_rows_check.hpp"

namespace cobalt {
namespace {

TEST(RoutingBatch, ViewsRows) {
  std::vector<ExpertId> ids = {0, 1, 2, 3, 1, 0};
  std::vector<RankId> src = {0, 1, 1};
  RoutingBatch batch(ids, src, 2, 4, 2);
  EXPECT_EQ(batch.num_tokens(), 3);
  EXPECT_EQ(batch.num_tasks(), 6);
  EXPECT_EQ(batch.experts_of(1)[0], 2);
  EXPECT_EQ(batch.source_of(2), 1);
  auto tail = batch.slice(1, 3);
  EXPECT_EQ(tail.num_tokens(), 2);
  EXPECT_EQ(tail.experts_of(0)[1], 3);
  EXPECT_THROW(batch.slice(2, 4), Error);
}

TEST(RoutingBatch, RejectsBadInput) {
  std::vector<RankId> src = {0, 0};
  std::vector<ExpertId> out_of_range = {0, 4, 1, 2};
  EXPECT_THROW(RoutingBatch(out_of_range, src, 2, 4, 1), Error);
  std::vector<ExpertId> negative = {0, -1, 1, 2};
  EXPECT_THROW(RoutingBatch(negative, src, 2, 4, 1), Error);
  std::vector<ExpertId> repeated = {0, 1, 2, 2};
  try {
    RoutingBatch(repeated, src, 2, 4, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 selects expert 2 twice"), std::string::npos)
        << e.what();
  }
  std::vector<ExpertId> ok = {0, 1, 2, 3};
  std::vector<RankId> bad_src = {0, 5};
  EXPECT_THROW(RoutingBatch(ok, bad_src, 2, 4, 2), Error);
  std::vector<RankId> short_src = {0};
  EXPECT_THROW(RoutingBatch(ok, short_src, 2, 4, 2), Error);
  EXPECT_THROW(RoutingBatch(ok, src, 5, 4, 2), Error);  // top-k > E
}

// Whether the reference loop accepts the rows (and its message when it does not).
bool reference_accepts(std::span<const ExpertId> ids, int top_k, int num_experts,
                       std::string* message) {
  try {
    detail::validate_topk_rows_reference(ids, top_k, num_experts, "rows");
    return true;
  } catch (const Error& e) {
    *message = e.what();
    return false;
  }
}

// The branch-free accept tests against the plain loops on random batches of every row length the
// fast test specialises (1, 2, 4, 6, 8) and others, with one bad entry (out of range above,
// negative, a copy of any other slot of its row) or none, anywhere in batches that span several
// blocks; and validate_topk_rows reports what the reference reports.
TEST(RoutingBatch, FastChecksAgreeWithTheReferenceLoops) {
  SplitMix64 rng(5);
  int refused = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int top_k = 1 + static_cast<int>(rng.below(12));
    const int num_experts = top_k + static_cast<int>(rng.below(40));
    const auto num_tokens = static_cast<size_t>(rng.below(trial % 7 == 0 ? 9000 : 200));
    std::vector<ExpertId> ids(num_tokens * static_cast<size_t>(top_k));
    for (size_t t = 0; t < num_tokens; ++t) {
      // K distinct ids: a partial Fisher-Yates shuffle of [0, E).
      std::vector<ExpertId> pool(static_cast<size_t>(num_experts));
      for (int e = 0; e < num_experts; ++e) pool[static_cast<size_t>(e)] = e;
      for (int k = 0; k < top_k; ++k) {
        const auto pick = k + static_cast<int>(rng.below(static_cast<uint32_t>(num_experts - k)));
        std::swap(pool[static_cast<size_t>(k)], pool[static_cast<size_t>(pick)]);
        ids[t * static_cast<size_t>(top_k) + static_cast<size_t>(k)] = pool[static_cast<size_t>(k)];
      }
    }
    const int fault = static_cast<int>(rng.below(4));  // 0 none, 1 above, 2 negative, 3 repeat
    if (num_tokens > 0 && fault != 0 && !(fault == 3 && top_k == 1)) {
      const size_t t = rng.below(static_cast<uint32_t>(num_tokens));
      const auto k = static_cast<size_t>(rng.below(static_cast<uint32_t>(top_k)));
      ExpertId& entry = ids[t * static_cast<size_t>(top_k) + k];
      if (fault == 1) entry = num_experts + static_cast<ExpertId>(rng.below(3));
      if (fault == 2) entry = -1 - static_cast<ExpertId>(rng.below(3)) * 1000000000;
      if (fault == 3) {  // a copy of any other slot of the row: every pair of slots can collide
        const auto other =
            (k + 1 + rng.below(static_cast<uint32_t>(top_k - 1))) % static_cast<size_t>(top_k);
        entry = ids[t * static_cast<size_t>(top_k) + other];
      }
    }
    std::string expected;
    const bool accepted = reference_accepts(ids, top_k, num_experts, &expected);
    ASSERT_EQ(detail::topk_rows_valid(ids, top_k, num_experts), accepted)
        << "K " << top_k << " E " << num_experts << " T " << num_tokens << " fault " << fault;
    refused += accepted ? 0 : 1;
    if (!accepted) {
      try {
        validate_topk_rows(ids, top_k, num_experts, "rows");
        FAIL() << "validate_topk_rows accepted what the reference refuses: " << expected;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), expected);
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      }
    }

    // Source ranks: one out of range (above or negative) or none.
    const int num_ranks = 1 + static_cast<int>(rng.below(9));
    std::vector<RankId> ranks(num_tokens);
    for (auto& r : ranks) r = static_cast<RankId>(rng.below(static_cast<uint32_t>(num_ranks)));
    const int rank_fault = static_cast<int>(rng.below(3));
    if (num_tokens > 0 && rank_fault != 0) {
      ranks[rng.below(static_cast<uint32_t>(num_tokens))] = rank_fault == 1 ? num_ranks : -1;
    }
    const bool ranks_ok = num_tokens == 0 || rank_fault == 0;
    EXPECT_EQ(detail::ranks_valid(ranks, num_ranks), ranks_ok);
  }
  EXPECT_GT(refused, 1000);  // faults were injected and found
}

TEST(RoutingBatch, ContiguousSourceRanks) {
  std::vector<RankId> out(10);
  contiguous_source_ranks(10, 4, out);
  // floor(i * 4 / 10)
  EXPECT_EQ(out, (std::vector<RankId>{0, 0, 0, 1, 1, 2, 2, 2, 3, 3}));
  // G = 0 wrote rank 0 and G = -3 ranks down to -2.
  EXPECT_THROW(contiguous_source_ranks(10, 0, out), Error);
  EXPECT_THROW(contiguous_source_ranks(10, -3, out), Error);
  EXPECT_THROW(contiguous_source_ranks(-1, 4, out), Error);
  EXPECT_THROW(contiguous_source_ranks(11, 4, out), Error);
}

}  // namespace
}  // namespace cobalt
