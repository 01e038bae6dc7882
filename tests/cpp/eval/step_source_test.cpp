// Step sources: the trace's own steps, re-chunking, cycling, source mapping and load-only traces.
#include "cobalt/eval/step_source.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "cobalt/core/error.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

// T tokens, K = 2, token i chooses experts (i % E, (i + 1) % E); L layers (layer l adds l).
io::TraceData numbered_trace(int64_t num_tokens, int num_experts, int num_layers,
                             bool with_sources) {
  io::TraceData d;
  d.num_experts = num_experts;
  d.top_k = 2;
  d.num_layers = num_layers;
  d.num_tokens = num_tokens;
  for (int l = 0; l < num_layers; ++l) {
    for (int64_t i = 0; i < num_tokens; ++i) {
      d.topk_ids.push_back(static_cast<ExpertId>((i + l) % num_experts));
      d.topk_ids.push_back(static_cast<ExpertId>((i + l + 1) % num_experts));
    }
  }
  d.step_offsets = {0, num_tokens / 3, num_tokens};
  if (with_sources) {
    d.num_sources = 4;
    for (int64_t i = 0; i < num_tokens; ++i) d.source_rank.push_back(static_cast<RankId>(i % 4));
  }
  return d;
}

// The first expert id of every token of (step, layer), i.e. the trace token index mod E.
std::vector<ExpertId> first_ids(const StepSource& src, int step, int layer, int num_ranks) {
  StepScratch scratch;
  auto batch = src.batch(step, layer, num_ranks, scratch);
  std::vector<ExpertId> out;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) out.push_back(batch.experts_of(t)[0]);
  return out;
}

TEST(StepSource, OwnStepsByDefault) {
  const auto d = numbered_trace(30, 1000, 1, false);
  auto src = make_step_source(d);
  ASSERT_EQ(src->num_steps(), 2);
  EXPECT_EQ(src->num_tokens(0), 10);
  EXPECT_EQ(src->num_tokens(1), 20);
  EXPECT_EQ(src->chunk_info().mode, "trace");
  EXPECT_EQ(first_ids(*src, 1, 0, 4).front(), 10);
}

TEST(StepSource, RechunksIntoStepsCoveringEveryTokenOnce) {
  const auto d = numbered_trace(31, 1000, 2, false);
  auto src = make_step_source(d, {.num_steps = 4});
  ASSERT_EQ(src->num_steps(), 4);
  EXPECT_EQ(src->chunk_info().mode, "rechunked");
  std::vector<ExpertId> all;
  for (int s = 0; s < 4; ++s) {
    auto ids = first_ids(*src, s, 1, 8);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  ASSERT_EQ(all.size(), 31u);
  for (int i = 0; i < 31; ++i) EXPECT_EQ(all[i], i + 1);  // layer 1 adds 1
  // Without sources, each re-chunked step is split over the ranks in contiguous blocks.
  StepScratch scratch;
  auto batch = src->batch(0, 0, 2, scratch);
  EXPECT_EQ(batch.source_of(0), 0);
  EXPECT_EQ(batch.source_of(batch.num_tokens() - 1), 1);
  EXPECT_THROW(make_step_source(d, {.num_steps = 32}), Error);
}

TEST(StepSource, TokensPerStepCutsAndCycles) {
  const auto d = numbered_trace(10, 1000, 1, true);
  auto cut = make_step_source(d, {.tokens_per_step = 3});
  EXPECT_EQ(cut->num_steps(), 3);  // floor(10 / 3); the last token is left out
  EXPECT_EQ(cut->chunk_info().mode, "rechunked");
  auto cyc = make_step_source(d, {.num_steps = 5, .tokens_per_step = 4});
  ASSERT_EQ(cyc->num_steps(), 5);
  EXPECT_EQ(cyc->chunk_info().mode, "cycled");
  EXPECT_DOUBLE_EQ(cyc->chunk_info().passes, 2.0);
  // Step 2 = extended tokens 8..11 = trace tokens 8, 9, 0, 1 (wraps around the end).
  EXPECT_EQ(first_ids(*cyc, 2, 0, 4), (std::vector<ExpertId>{8, 9, 0, 1}));
  StepScratch scratch;
  auto batch = cyc->batch(2, 0, 2, scratch);
  // Sources follow their tokens: trace source i % 4 of R = 4 mapped onto 2 ranks.
  EXPECT_EQ(batch.source_of(0), 0);        // token 8: source 0
  EXPECT_EQ(batch.source_of(1), 0);        // token 9: source 1 -> rank 0
  EXPECT_EQ(batch.source_of(3), 0);        // token 1: source 1
  auto b2 = cyc->batch(1, 0, 2, scratch);  // tokens 4..7: sources 0, 1, 2, 3
  EXPECT_EQ(b2.source_of(2), 1);
  EXPECT_THROW(make_step_source(d, {.tokens_per_step = 0}), Error);
}

io::TraceData counts_trace() {
  io::TraceData d;
  d.num_experts = 3;
  d.top_k = 1;
  d.num_layers = 1;
  d.num_sources = 4;
  d.num_count_steps = 2;
  // [S = 2, L = 1, R = 4, E = 3]
  d.counts = {1, 0, 0, 0, 2, 0, 0, 0, 3, 4, 0, 0,   // step 0
              0, 1, 1, 1, 1, 0, 5, 0, 0, 0, 0, 7};  // step 1
  return d;
}

// Malformed in-memory traces are refused with the trace rules' error, not read out of bounds or
// divided by zero.
TEST(StepSource, RejectsMalformedTraceData) {
  auto no_tokens = numbered_trace(6, 4, 1, false);
  no_tokens.num_tokens = 0;  // ids present, T = 0
  auto no_count_steps = counts_trace();
  no_count_steps.num_count_steps = 0;
  auto short_sources = numbered_trace(6, 4, 1, true);
  short_sources.source_rank.pop_back();
  auto bad_id = numbered_trace(6, 4, 1, false);
  bad_id.topk_ids[3] = 9;
  for (const io::TraceData* d : {&no_tokens, &no_count_steps, &short_sources, &bad_id}) {
    try {
      make_step_source(*d);
      ADD_FAILURE() << "accepted malformed trace data";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("step source"), std::string::npos) << e.what();
    }
  }
}

TEST(StepSource, LoadOnlyTracesServeMappedLoads) {
  const auto d = counts_trace();
  auto src = make_step_source(d);
  EXPECT_FALSE(src->has_tokens());
  EXPECT_EQ(src->num_steps(), 2);
  StepScratch scratch;
  std::vector<int64_t> loads(2 * 3);
  src->loads(0, 0, 2, loads, scratch);  // sources 0, 1 -> rank 0; 2, 3 -> rank 1
  EXPECT_EQ(loads, (std::vector<int64_t>{1, 2, 0, 4, 0, 3}));
  EXPECT_THROW(src->batch(0, 0, 2, scratch), Error);
  // --steps cycles the trace's steps.
  auto cyc = make_step_source(d, {.num_steps = 3});
  cyc->loads(2, 0, 2, loads, scratch);
  EXPECT_EQ(loads, (std::vector<int64_t>{1, 2, 0, 4, 0, 3}));
  EXPECT_EQ(cyc->chunk_info().mode, "cycled");
  EXPECT_THROW(make_step_source(d, {.tokens_per_step = 5}), Error);
}

TEST(StepSource, LoadOnlyTraceFromFile) {
  const auto path =
      std::filesystem::temp_directory_path() / "cobalt_step_source_counts.safetensors";
  io::write_trace(path.string(), counts_trace());
  io::TraceReader reader(path.string());
  auto src = make_step_source(reader);
  StepScratch scratch;
  std::vector<int64_t> loads(4 * 3);
  src->loads(1, 0, 4, loads, scratch);
  EXPECT_EQ(loads, (std::vector<int64_t>{0, 1, 1, 1, 1, 0, 5, 0, 0, 0, 0, 7}));
  std::filesystem::remove(path);
}

// Without num_sources, a trace's sources are 0 .. max source: sources 0..3 of a 4-rank trace
// map to ranks 0..3.
TEST(StepSource, DataWithoutNumSourcesMapsSourcesOneToOne) {
  io::TraceData d = testing::id_trace(4, 1, 1, 4, [](int64_t t, int) { return t; });
  d.source_rank = {0, 1, 2, 3};  // num_sources stays 0
  d.step_offsets = {0, 4};
  auto source = make_step_source(d);
  StepScratch scratch;
  const RoutingBatch batch = source->batch(0, 0, 4, scratch);
  for (TokenIdx t = 0; t < 4; ++t) EXPECT_EQ(batch.source_of(t), t);
}

}  // namespace
}  // namespace cobalt::eval
