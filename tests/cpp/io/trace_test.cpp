// Tests of the cobalt-trace v1 reader/writer (include/cobalt/io/trace.hpp): round trips,
// hand-written files (I16 ids, misaligned data), writer guarantees and the real traces in
// ../shared/data/traces. Malformed input: trace_reject_test.cpp; mutations: trace_fuzz_test.cpp.
#include "cobalt/io/safetensors.hpp"
#include "io/trace_fixtures.hpp"

namespace cobalt::io {
namespace {

using namespace test_support;  // NOLINT(build/namespaces): test helpers

// ---------------------------------------------------------------------------------------------------
// Round trips

TEST(TraceRoundTrip, MultiStepWithSourceRank) {
  TempDir dir;
  TraceData data;
  data.num_experts = 6;
  data.top_k = 2;
  data.num_layers = 3;
  data.num_tokens = 10;
  for (int layer = 0; layer < 3; ++layer) {
    for (int t = 0; t < 10; ++t) {
      data.topk_ids.push_back((t + layer) % 6);
      data.topk_ids.push_back((t + layer + 1 + t % 3) % 6);
    }
  }
  data.step_offsets = {0, 3, 3, 10};
  data.source_rank = {0, 0, 1, 1, 1, 2, 2, 3, 3, 3};
  data.metadata = {{"model", "toy"}, {"notes", "hello \"world\"\n"}};
  const std::string path = dir.file("t.safetensors");
  write_trace(path, data);
  EXPECT_EQ(dir.num_entries(), 1u) << "temporary file left behind";

  // Header padded so that the data section starts on an 8-byte boundary.
  const std::string bytes = read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);

  const TraceReader reader(path);
  EXPECT_EQ(reader.path(), path);
  EXPECT_EQ(reader.num_experts(), 6);
  EXPECT_EQ(reader.top_k(), 2);
  EXPECT_EQ(reader.num_layers(), 3);
  EXPECT_EQ(reader.num_tokens(), 10);
  EXPECT_EQ(reader.num_steps(), 3);
  EXPECT_TRUE(reader.has_token_ids());
  EXPECT_FALSE(reader.has_counts());
  EXPECT_TRUE(reader.has_source_rank());
  EXPECT_EQ(reader.num_sources(), 4);  // max + 1, stored as metadata num_sources
  EXPECT_EQ(reader.metadata().at("num_sources"), "4");
  EXPECT_EQ(reader.metadata().at("format"), "cobalt-trace");
  EXPECT_EQ(reader.metadata().at("model"), "toy");
  EXPECT_EQ(std::vector<int64_t>(reader.step_offsets().begin(), reader.step_offsets().end()),
            data.step_offsets);

  std::vector<ExpertId> scratch;
  const auto ids = reader.topk_ids(1, 3, 10, scratch);
  ASSERT_EQ(ids.size(), 14u);
  EXPECT_TRUE(scratch.empty()) << "aligned I32 data should be served zero-copy";
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], data.topk_ids[(10 + 3) * 2 + i]);
  EXPECT_TRUE(reader.topk_ids(2, 3, 3, scratch).empty());
  std::vector<RankId> rank_scratch;
  const auto ranks = reader.source_rank(5, 9, rank_scratch);
  EXPECT_EQ(std::vector<RankId>(ranks.begin(), ranks.end()), (std::vector<RankId>{2, 2, 3, 3}));

  const TraceData loaded = reader.load();
  EXPECT_EQ(loaded.topk_ids, data.topk_ids);
  EXPECT_EQ(loaded.step_offsets, data.step_offsets);
  EXPECT_EQ(loaded.source_rank, data.source_rank);
  EXPECT_EQ(loaded.num_sources, 4);
  EXPECT_EQ(loaded.metadata, data.metadata);
  EXPECT_TRUE(loaded.counts.empty());

  // Writing what was loaded gives the same bytes again.
  const std::string path2 = dir.file("t2.safetensors");
  write_trace(path2, loaded);
  EXPECT_EQ(read_file(path2), bytes);
}

TEST(TraceRoundTrip, SingleStepWithoutSourceRank) {
  TempDir dir;
  const TraceData data = small_data();
  const std::string path = dir.file("t.safetensors");
  write_trace(path, data);
  const TraceReader reader(path);
  EXPECT_EQ(reader.num_steps(), 1);
  EXPECT_EQ(std::vector<int64_t>(reader.step_offsets().begin(), reader.step_offsets().end()),
            (std::vector<int64_t>{0, kTokens}));
  EXPECT_FALSE(reader.has_source_rank());
  EXPECT_EQ(reader.num_sources(), 0);
  EXPECT_EQ(reader.metadata().count("num_sources"), 0u);
  std::vector<RankId> scratch;
  EXPECT_THROW(reader.source_rank(0, 1, scratch), Error);
  const TraceData loaded = reader.load();
  EXPECT_EQ(loaded.topk_ids, data.topk_ids);
  EXPECT_EQ(loaded.step_offsets, (std::vector<int64_t>{0, kTokens}));
  EXPECT_TRUE(loaded.source_rank.empty());
  EXPECT_TRUE(loaded.metadata.empty());
}

TEST(TraceRoundTrip, LoadOnlyCounts) {
  TempDir dir;
  TraceData data;
  data.num_experts = 4;
  data.top_k = 2;
  data.num_layers = 2;
  data.num_sources = 3;
  data.num_count_steps = 2;
  for (int i = 0; i < 2 * 2 * 3 * 4; ++i) data.counts.push_back(i % 5);
  data.metadata = {{"origin", "synthetic"}};
  const std::string path = dir.file("c.safetensors");
  write_trace(path, data);

  const TraceReader reader(path);
  EXPECT_FALSE(reader.has_token_ids());
  EXPECT_TRUE(reader.has_counts());
  EXPECT_FALSE(reader.has_source_rank());
  EXPECT_EQ(reader.num_tokens(), 0);
  EXPECT_EQ(reader.num_layers(), 2);
  EXPECT_EQ(reader.num_steps(), 2);
  EXPECT_EQ(reader.num_sources(), 3);
  EXPECT_EQ(reader.step_offsets().size(), 3u);
  std::vector<int32_t> scratch;
  const auto block = reader.counts(1, 0, scratch);
  ASSERT_EQ(block.size(), 12u);
  for (size_t i = 0; i < block.size(); ++i) EXPECT_EQ(block[i], data.counts[24 + i]);
  std::vector<ExpertId> id_scratch;
  EXPECT_THROW(reader.topk_ids(0, 0, 0, id_scratch), Error);
  EXPECT_THROW(reader.counts(2, 0, scratch), Error);
  EXPECT_THROW(reader.counts(0, -1, scratch), Error);

  const TraceData loaded = reader.load();
  EXPECT_EQ(loaded.counts, data.counts);
  EXPECT_EQ(loaded.num_count_steps, 2);
  EXPECT_EQ(loaded.num_sources, 3);
  EXPECT_TRUE(loaded.topk_ids.empty());
  EXPECT_EQ(loaded.metadata, data.metadata);
}

// ---------------------------------------------------------------------------------------------------
// Hand-written files

TEST(TraceReader, ReadsI16Ids) {
  TempDir dir;
  std::vector<int16_t> ids;
  for (const int32_t id : small_ids()) ids.push_back(static_cast<int16_t>(id));
  const std::string path = dir.file("i16.safetensors");
  write_file(path,
             build_file(trace_meta(),
                        {{"topk_ids", "I16", {kLayers, kTokens, 2}, bytes_of(ids)},
                         {"layer_ids", "I32", {kLayers}, bytes_of(std::vector<int32_t>{3, 9})}}));
  const TraceReader reader(path);
  EXPECT_EQ(reader.num_layers(), kLayers);
  std::vector<ExpertId> scratch;
  const auto layer1 = reader.topk_ids(1, 0, kTokens, scratch);
  const std::vector<int32_t> expected = small_ids();
  EXPECT_EQ(std::vector<ExpertId>(layer1.begin(), layer1.end()),
            std::vector<ExpertId>(expected.begin() + 12, expected.end()));
  EXPECT_EQ(reader.load().topk_ids, expected);
}

TEST(TraceReader, ReadsMisalignedI32Data) {
  TempDir dir;
  const std::string path = dir.file("misaligned.safetensors");
  // Pick the padding so that the data section starts at 2 mod 4: every I32 element is misaligned.
  std::string bytes;
  for (size_t pad = 0; pad < 8; ++pad) {
    bytes = build_file(trace_meta(), small_tensors(), {}, pad);
    uint64_t len = 0;
    std::memcpy(&len, bytes.data(), 8);
    if ((8 + len) % 4 == 2) break;
  }
  write_file(path, bytes);
  const TraceReader reader(path);
  EXPECT_EQ(reader.num_steps(), 2);
  std::vector<ExpertId> scratch;
  const auto ids = reader.topk_ids(0, 2, 6, scratch);
  EXPECT_EQ(ids.data(), scratch.data()) << "misaligned data must be copied";
  const std::vector<int32_t> all = small_ids();
  EXPECT_EQ(std::vector<ExpertId>(ids.begin(), ids.end()),
            std::vector<ExpertId>(all.begin() + 4, all.begin() + 12));
  std::vector<RankId> rank_scratch;
  const auto ranks = reader.source_rank(0, kTokens, rank_scratch);
  EXPECT_EQ(std::vector<RankId>(ranks.begin(), ranks.end()),
            (std::vector<RankId>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(reader.num_sources(), 3);
  EXPECT_EQ(reader.load().topk_ids, all);
}

TEST(TraceReader, AcceptsOptionalTensors) {
  TempDir dir;
  const std::string path = dir.file("opt.safetensors");
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"topk_weights", "BF16", {kLayers, kTokens, 2}, std::string(48, '\0')});
  tensors.push_back({"layer_ids", "I32", {kLayers}, bytes_of(std::vector<int32_t>{0, 5})});
  tensors.push_back({"token_ids", "I32", {kTokens}, bytes_of(std::vector<int32_t>(kTokens, 7))});
  Json meta = trace_meta();
  meta["num_sources"] = "4";
  meta["dataset"] = "x";
  write_file(path, build_file(meta, tensors));
  const TraceReader reader(path);
  EXPECT_EQ(reader.num_sources(), 4);
  EXPECT_EQ(reader.load().metadata, (std::map<std::string, std::string>{{"dataset", "x"}}));
}

TEST(TraceReader, AccessorsCheckRanges) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_file(path, build_file(trace_meta(), small_tensors()));
  const TraceReader reader(path);
  std::vector<ExpertId> scratch;
  EXPECT_THROW(reader.topk_ids(-1, 0, 1, scratch), Error);
  EXPECT_THROW(reader.topk_ids(kLayers, 0, 1, scratch), Error);
  EXPECT_THROW(reader.topk_ids(0, 3, 2, scratch), Error);
  EXPECT_THROW(reader.topk_ids(0, 0, kTokens + 1, scratch), Error);
  EXPECT_THROW(reader.topk_ids(0, -1, 1, scratch), Error);
  std::vector<RankId> rank_scratch;
  EXPECT_THROW(reader.source_rank(0, kTokens + 1, rank_scratch), Error);
  std::vector<int32_t> count_scratch;
  EXPECT_THROW(reader.counts(0, 0, count_scratch), Error);

  // Moving keeps the mapping alive.
  TraceReader moved = TraceReader(path);
  moved = TraceReader(path);
  EXPECT_EQ(moved.topk_ids(1, 0, 1, scratch)[0], 1);
}

// ---------------------------------------------------------------------------------------------------
// Writer

TEST(TraceWriter, RejectsInvalidDataAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const auto expect_bad = [&](const TraceData& data, const std::string& needle) {
    try {
      write_trace(path, data);
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(dir.num_entries(), 0u);
  };
  TraceData data = small_data();
  data.topk_ids[3] = 8;
  expect_bad(data, "expert id 8 out of range");
  data = small_data();
  data.topk_ids[3] = data.topk_ids[2];
  expect_bad(data, "repeated");
  data = small_data();
  data.topk_ids.pop_back();
  expect_bad(data, "tensor topk_ids");
  data = small_data();
  data.step_offsets = {0, 4, 3, 6};
  expect_bad(data, "decreases");
  data = small_data();
  data.source_rank = {0, 1, 2, 3, 4, 5};
  data.num_sources = 3;
  expect_bad(data, "source rank 3 out of range");
  data = small_data();
  data.metadata["num_experts"] = "8";
  expect_bad(data, "reserved");
  data = small_data();
  data.top_k = 9;
  expect_bad(data, "top_k 9");
  data = small_data();
  data.counts = {1, 2};
  expect_bad(data, "load-only");
  data = small_data();
  data.metadata["bad"] = "\xff\xfe";
  expect_bad(data, "cannot encode");
  // A header the reader would refuse (over 100 MB of metadata) is not written.
  data = small_data();
  data.metadata["notes"] = std::string(kMaxSafetensorsHeaderBytes, 'x');
  expect_bad(data, "out of range [2, 100000000]");
}

TEST(TraceWriter, ReplacesExistingFile) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_file(path, "garbage");
  TraceData data = small_data();
  write_trace(path, data);
  const TraceReader first(path);
  data.metadata["model"] = "second";
  write_trace(path, data);  // replaces the file while `first` still maps the old one
  EXPECT_EQ(TraceReader(path).metadata().at("model"), "second");
  EXPECT_EQ(first.load().topk_ids, data.topk_ids);
  EXPECT_EQ(dir.num_entries(), 1u);
  EXPECT_THROW(write_trace(dir.file("missing_dir/t.safetensors"), data), Error);
}

// ---------------------------------------------------------------------------------------------------
// Real traces (../shared/data/traces, see its README)

struct RealTrace {
  const char* file;
  int num_experts;
  int top_k;
  int num_layers;
  int64_t num_tokens;
  int num_steps;
};

class TraceRealData : public ::testing::TestWithParam<RealTrace> {};

TEST_P(TraceRealData, LoadsWithReadmeDimensions) {
  const fs::path dir = fs::path(COBALT_SHARED_DIR) / "data" / "traces";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " absent";
  const RealTrace& expected = GetParam();
  const std::string path = (dir / expected.file).string();
  if (!fs::exists(path)) GTEST_SKIP() << path << " absent";
  const TraceReader reader(path);
  EXPECT_EQ(reader.num_experts(), expected.num_experts);
  EXPECT_EQ(reader.top_k(), expected.top_k);
  EXPECT_EQ(reader.num_layers(), expected.num_layers);
  EXPECT_EQ(reader.num_tokens(), expected.num_tokens);
  EXPECT_EQ(reader.num_steps(), expected.num_steps);
  EXPECT_TRUE(reader.has_token_ids());
  EXPECT_FALSE(reader.has_source_rank());
  EXPECT_FALSE(reader.has_counts());
  EXPECT_EQ(reader.num_sources(), 0);
  EXPECT_EQ(reader.metadata().count("model"), 1u);
  EXPECT_EQ(touch_everything(reader),
            int64_t{expected.num_layers} * expected.num_tokens * expected.top_k);
}

INSTANTIATE_TEST_SUITE_P(
    TraceReadme, TraceRealData,
    ::testing::Values(RealTrace{"qwen15-moe-a2.7b_gsm8k_5layers.safetensors", 60, 4, 5, 4357, 129},
                      RealTrace{"olmoe-1b-7b_layer0.safetensors", 64, 8, 1, 4471, 1}),
    [](const ::testing::TestParamInfo<RealTrace>& info) {
      return info.index == 0 ? std::string("Qwen15MoeGsm8k") : std::string("Olmoe1b7bLayer0");
    });

}  // namespace
}  // namespace cobalt::io
