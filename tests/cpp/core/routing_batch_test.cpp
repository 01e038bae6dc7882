#include "cobalt/core/routing_batch.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "cobalt/core/error.hpp"

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

TEST(RoutingBatch, ContiguousSourceRanks) {
  std::vector<RankId> out(10);
  contiguous_source_ranks(10, 4, out);
  // floor(i * 4 / 10)
  EXPECT_EQ(out, (std::vector<RankId>{0, 0, 0, 1, 1, 2, 2, 2, 3, 3}));
}

}  // namespace
}  // namespace cobalt
