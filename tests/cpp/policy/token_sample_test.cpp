// The planner's token sample (src/policy/token_sample.hpp): micro-batches of a step share one
// sample of at most kTokensPerStep tokens, equal to the whole step's while it fits, and the ring
// keeps kSteps steps.
#include "policy/token_sample.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "testing/random_inputs.hpp"

namespace cobalt::policy::detail {
namespace {

RoutingBatch tokens_of(const testing::OwnedBatch& b, int64_t first, int64_t count) {
  return RoutingBatch(std::span(b.topk_ids).subspan(first * b.top_k, count * b.top_k),
                      std::span(b.source_rank).subspan(first, count), b.top_k, b.num_experts,
                      b.num_ranks);
}

TEST(TokenSample, MicroBatchesOfAStepThatFitsAreTheWholeStep) {
  const auto batch = testing::random_batch(3, 3000, 4, 32, 8, 1.0);
  TokenSample whole, parts;
  whole.record(batch.view());
  parts.record(tokens_of(batch, 0, 1000));
  parts.fold(tokens_of(batch, 1000, 0));
  parts.fold(tokens_of(batch, 1000, 1500));
  parts.fold(tokens_of(batch, 2500, 500));
  EXPECT_TRUE(std::ranges::equal(parts.ids(), whole.ids()));
  EXPECT_TRUE(std::ranges::equal(parts.sources(), whole.sources()));
  EXPECT_DOUBLE_EQ(parts.step_scale(), 1.0);
}

// Above kTokensPerStep, any split keeps one sample of kTokensPerStep tokens per step, drawn from
// the micro-batches in proportion to their tokens, and the scale is the whole step's.
TEST(TokenSample, AStepKeepsOneSampleOfTheCapWhateverItsMicroBatches) {
  auto batch = testing::random_batch(5, 20000, 2, 16, 64, 0.5);
  for (int64_t parts_count : {2, 5, 40}) {
    const int64_t part = 20000 / parts_count;
    // Each micro-batch's tokens come from its own source rank, so the sample shows its shares.
    for (int64_t t = 0; t < 20000; ++t) batch.source_rank[t] = static_cast<RankId>(t / part);
    TokenSample sample;
    for (int64_t p = 0; p < parts_count; ++p) sample.fold(tokens_of(batch, p * part, part));
    EXPECT_EQ(sample.sources().size(), size_t{TokenSample::kTokensPerStep}) << parts_count;
    EXPECT_EQ(sample.ids().size(), size_t{2 * TokenSample::kTokensPerStep});
    EXPECT_DOUBLE_EQ(sample.step_scale(), 20000.0 / TokenSample::kTokensPerStep);
    std::vector<int64_t> per_part(parts_count, 0);
    for (RankId src : sample.sources()) ++per_part[src];
    const double share = static_cast<double>(TokenSample::kTokensPerStep) / parts_count;
    // Within 10% of its share (each fold thins the sample so far by a stride, and the rounding of
    // forty successive thinnings leaves one part at 111 of 102.4).
    for (int64_t p = 0; p < parts_count; ++p) {
      EXPECT_NEAR(per_part[p], share, 0.1 * share + 2) << parts_count << " " << p;
    }
  }
}

TEST(TokenSample, KeepsTheLastStepsOnly) {
  TokenSample sample;
  for (int step = 0; step < 7; ++step) {
    sample.record(testing::random_batch(step, 100 * (step + 1), 3, 16, 4, 0.0).view());
  }
  // Steps 3..6 (400, 500, 600 and 700 tokens), all below the cap: every token kept.
  EXPECT_EQ(sample.sources().size(), size_t{400 + 500 + 600 + 700});
  EXPECT_DOUBLE_EQ(sample.step_scale(), 0.25);
  EXPECT_TRUE(TokenSample{}.empty());
  EXPECT_DOUBLE_EQ(TokenSample{}.step_scale(), 1.0);
}

}  // namespace
}  // namespace cobalt::policy::detail
