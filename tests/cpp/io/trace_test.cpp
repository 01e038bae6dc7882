// Tests of the cobalt-trace v1 reader/writer (include/cobalt/io/trace.hpp): round trips,
// hand-written files (I16 ids, misaligned data), one test per kind of malformed input, a
// byte-mutation fuzz test and the real traces in ../shared/data/traces.
#include "cobalt/io/trace.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// A fresh directory, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::path(::testing::TempDir()) / "cobalt_trace_XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t num_entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(path_), {}));
  }

 private:
  fs::path path_;
};

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// 8-byte length + header text (padded with `pad` spaces) + data.
std::string raw_file(const std::string& header, const std::string& data, size_t pad = 0) {
  const std::string text = header + std::string(pad, ' ');
  const uint64_t len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + text + data;
}

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A safetensors file with `tensors` laid out in order; `edit` may alter the header JSON afterwards.
std::string build_file(const Json& metadata, const std::vector<RawTensor>& tensors,
                       const std::function<void(Json&)>& edit = {}, size_t pad = 0) {
  Json header = Json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string data;
  for (const RawTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {data.size(), data.size() + tensor.bytes.size()}}};
    data += tensor.bytes;
  }
  if (edit) edit(header);
  return raw_file(header.dump(), data, pad);
}

Json trace_meta(int num_experts = 8, int top_k = 2) {
  return {{"format", "cobalt-trace"},
          {"version", "1"},
          {"num_experts", std::to_string(num_experts)},
          {"top_k", std::to_string(top_k)}};
}

// A valid small token trace: E = 8, K = 2, L = 2, T = 6, steps {0, 2, 6}, 3 sources.
constexpr int kLayers = 2;
constexpr int64_t kTokens = 6;
std::vector<int32_t> small_ids() {
  return {0, 1, 2, 3, 4, 5, 6, 7, 7, 0, 3, 5,   // layer 0
          1, 0, 3, 2, 5, 4, 7, 6, 0, 7, 5, 3};  // layer 1
}
std::vector<RawTensor> small_tensors() {
  return {{"topk_ids", "I32", {kLayers, kTokens, 2}, bytes_of(small_ids())},
          {"step_offsets", "I64", {3}, bytes_of(std::vector<int64_t>{0, 2, 6})},
          {"source_rank", "I32", {kTokens}, bytes_of(std::vector<int32_t>{0, 0, 1, 1, 2, 2})}};
}

TraceData small_data() {
  TraceData data;
  data.num_experts = 8;
  data.top_k = 2;
  data.num_layers = kLayers;
  data.num_tokens = kTokens;
  data.topk_ids = small_ids();
  return data;
}

// Opens `path` and touches every view (what a replay would do); returns the number of ids seen.
int64_t touch_everything(const TraceReader& reader) {
  int64_t num_ids = 0;
  std::vector<ExpertId> id_scratch;
  std::vector<RankId> rank_scratch;
  std::vector<int32_t> count_scratch;
  const auto offsets = reader.step_offsets();
  for (int step = 0; step < reader.num_steps(); ++step) {
    for (int layer = 0; layer < reader.num_layers(); ++layer) {
      if (reader.has_token_ids()) {
        num_ids += static_cast<int64_t>(
            reader.topk_ids(layer, offsets[step], offsets[step + 1], id_scratch).size());
      }
      if (reader.has_counts()) num_ids += reader.counts(step, layer, count_scratch).size();
    }
    if (reader.has_source_rank())
      reader.source_rank(offsets[step], offsets[step + 1], rank_scratch);
  }
  const TraceData data = reader.load();
  EXPECT_EQ(static_cast<int64_t>(data.topk_ids.size()),
            int64_t{reader.num_layers()} * reader.num_tokens() * reader.top_k());
  return num_ids;
}

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
// Malformed input: one test per case. Every rejection is a cobalt::Error(kInvalidArgument) with a
// one-line message "trace FILE: ..." containing `needle`.

class TraceReject : public ::testing::Test {
 protected:
  void expect_rejected(const std::string& bytes, const std::string& needle) {
    const std::string path = dir_.file("bad.safetensors");
    write_file(path, bytes);
    expect_path_rejected(path, needle);
  }
  void expect_path_rejected(const std::string& path, const std::string& needle) {
    try {
      const TraceReader reader(path);
      ADD_FAILURE() << "accepted; expected an error containing: " << needle;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(message.rfind("trace " + path + ": ", 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message;
    }
  }
  // The small valid trace with `edit` applied to the header JSON.
  void expect_edit_rejected(const std::function<void(Json&)>& edit, const std::string& needle) {
    expect_rejected(build_file(trace_meta(), small_tensors(), edit), needle);
  }
  void expect_tensors_rejected(const std::vector<RawTensor>& tensors, const std::string& needle,
                               const Json& meta = trace_meta()) {
    expect_rejected(build_file(meta, tensors), needle);
  }
  // small_tensors() with tensor `name` replaced.
  std::vector<RawTensor> with(const RawTensor& replacement) {
    std::vector<RawTensor> tensors = small_tensors();
    for (RawTensor& tensor : tensors) {
      if (tensor.name == replacement.name) tensor = replacement;
    }
    return tensors;
  }
  std::vector<RawTensor> with_ids(std::vector<int32_t> ids) {
    return with({"topk_ids", "I32", {kLayers, kTokens, 2}, bytes_of(ids)});
  }
  std::vector<RawTensor> with_offsets(std::vector<int64_t> offsets) {
    return with({"step_offsets", "I64", {static_cast<int64_t>(offsets.size())}, bytes_of(offsets)});
  }
  std::vector<RawTensor> with_ranks(std::vector<int32_t> ranks) {
    return with({"source_rank", "I32", {static_cast<int64_t>(ranks.size())}, bytes_of(ranks)});
  }

  TempDir dir_;
};

TEST_F(TraceReject, ValidBaselineIsAccepted) {
  const std::string path = dir_.file("ok.safetensors");
  write_file(path, build_file(trace_meta(), small_tensors()));
  EXPECT_EQ(touch_everything(TraceReader(path)), kLayers * kTokens * 2);
}

TEST_F(TraceReject, MissingFile) {
  expect_path_rejected(dir_.file("nope.safetensors"), "cannot open");
}

TEST_F(TraceReject, Directory) {
  const std::string path = dir_.file("sub");
  fs::create_directory(path);
  expect_path_rejected(path, "not a regular file");
}

TEST_F(TraceReject, EmptyFile) { expect_rejected("", "too short"); }

TEST_F(TraceReject, ShorterThanEightBytes) { expect_rejected("\x10\0\0\0", "too short"); }

TEST_F(TraceReject, HeaderLengthLargerThanFile) {
  std::string bytes = build_file(trace_meta(), small_tensors());
  const uint64_t huge = bytes.size();  // 8 + that > file size
  std::memcpy(bytes.data(), &huge, 8);
  expect_rejected(bytes, "header length");
  const uint64_t max = ~uint64_t{0};
  std::memcpy(bytes.data(), &max, 8);
  expect_rejected(bytes, "header length");
}

TEST_F(TraceReject, TruncatedFile) {
  const std::string bytes = build_file(trace_meta(), small_tensors());
  expect_rejected(bytes.substr(0, bytes.size() - 1), "out of range");
  expect_rejected(bytes.substr(0, 40), "header length");
}

TEST_F(TraceReject, InvalidJson) {
  expect_rejected(raw_file("{\"__metadata__\": {", ""), "invalid JSON");
  expect_rejected(raw_file(std::string("{\"a\0\": 1}", 9), ""), "invalid JSON");
  expect_rejected(raw_file("{\"\xff\": 1}", ""), "invalid JSON");
}

TEST_F(TraceReject, HeaderNotObject) {
  expect_rejected(raw_file("[1, 2, 3]", ""), "expected an object");
  expect_rejected(raw_file("\"str\"", ""), "expected an object");
}

TEST_F(TraceReject, MissingMetadata) {
  expect_rejected(build_file(Json(), small_tensors()), "__metadata__: missing");
}

TEST_F(TraceReject, MetadataNotStringMap) {
  Json meta = trace_meta();
  meta["num_experts"] = 8;
  expect_tensors_rejected(small_tensors(), "expected a string", meta);
  expect_edit_rejected([](Json& h) { h["__metadata__"] = Json::array(); }, "string map");
}

TEST_F(TraceReject, WrongFormat) {
  Json meta = trace_meta();
  meta["format"] = "pytorch";
  expect_tensors_rejected(small_tensors(), "format \"pytorch\"", meta);
  meta.erase("format");
  expect_tensors_rejected(small_tensors(), "format missing", meta);
}

TEST_F(TraceReject, WrongVersion) {
  Json meta = trace_meta();
  meta["version"] = "2";
  expect_tensors_rejected(small_tensors(), "version \"2\"", meta);
  meta.erase("version");
  expect_tensors_rejected(small_tensors(), "version missing", meta);
}

TEST_F(TraceReject, NumExpertsMissingOrNotPositive) {
  for (const char* bad : {"0", "-3", "eight", "8.0", "", " 8", "99999999999"}) {
    Json meta = trace_meta();
    meta["num_experts"] = bad;
    expect_tensors_rejected(small_tensors(), "num_experts", meta);
  }
  Json meta = trace_meta();
  meta.erase("num_experts");
  expect_tensors_rejected(small_tensors(), "num_experts missing", meta);
}

TEST_F(TraceReject, TopKMissingOrNotPositive) {
  for (const char* bad : {"0", "-1", "two", "2x"}) {
    Json meta = trace_meta();
    meta["top_k"] = bad;
    expect_tensors_rejected(small_tensors(), "top_k", meta);
  }
  Json meta = trace_meta();
  meta.erase("top_k");
  expect_tensors_rejected(small_tensors(), "top_k missing", meta);
  expect_tensors_rejected(small_tensors(), "top_k 2 out of range", trace_meta(1, 2));
}

TEST_F(TraceReject, NumSourcesNotPositive) {
  Json meta = trace_meta();
  meta["num_sources"] = "0";
  expect_tensors_rejected(small_tensors(), "num_sources", meta);
}

TEST_F(TraceReject, MissingTopkIds) {
  std::vector<RawTensor> tensors = small_tensors();
  tensors.erase(tensors.begin());
  expect_tensors_rejected(tensors, "tensor topk_ids: missing");
}

TEST_F(TraceReject, UnknownTensor) {
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"router_logits", "F32", {1}, std::string(4, '\0')});
  expect_tensors_rejected(tensors, "tensor router_logits: unknown tensor");
}

TEST_F(TraceReject, UnknownDtypeOrField) {
  expect_edit_rejected([](Json& h) { h["topk_ids"]["dtype"] = "Q7"; }, "unknown dtype Q7");
  expect_edit_rejected([](Json& h) { h["topk_ids"]["extra"] = 1; }, "unknown field extra");
  expect_edit_rejected([](Json& h) { h["topk_ids"] = 5; }, "expected an object");
}

TEST_F(TraceReject, WrongDtype) {
  expect_tensors_rejected(with({"topk_ids", "F32", {kLayers, kTokens, 2}, bytes_of(small_ids())}),
                          "tensor topk_ids: dtype F32 not supported");
  expect_tensors_rejected(
      with({"step_offsets", "I32", {3}, bytes_of(std::vector<int32_t>{0, 2, 6})}),
      "tensor step_offsets: dtype I32");
  expect_tensors_rejected(
      with({"source_rank", "I64", {kTokens}, bytes_of(std::vector<int64_t>(kTokens, 0))}),
      "tensor source_rank: dtype I64");
}

TEST_F(TraceReject, TopkLastDimMismatch) {
  expect_tensors_rejected(
      with({"topk_ids", "I32", {kLayers, kTokens * 2, 1}, bytes_of(small_ids())}),
      "K (top_k) = 1 out of range");
  expect_tensors_rejected(with({"topk_ids", "I32", {kLayers * kTokens * 2}, bytes_of(small_ids())}),
                          "is not 3-D");
}

TEST_F(TraceReject, TopkNoTokensOrLayers) {
  std::vector<RawTensor> tensors = {{"topk_ids", "I32", {0, 5, 2}, ""}};
  expect_tensors_rejected(tensors, "L = 0 out of range");
  tensors = {{"topk_ids", "I32", {int64_t{1} << 40, 0, 2}, ""}};
  expect_tensors_rejected(tensors, "out of range");
}

TEST_F(TraceReject, StepOffsetsNot1D) {
  expect_tensors_rejected(
      with({"step_offsets", "I64", {1, 3}, bytes_of(std::vector<int64_t>{0, 2, 6})}),
      "tensor step_offsets: shape [1, 3] is not 1-D");
  expect_tensors_rejected(with_offsets({0}), "S + 1 = 1 out of range");
}

TEST_F(TraceReject, SourceRankLengthMismatch) {
  expect_tensors_rejected(with_ranks({0, 1, 2}), "tensor source_rank: shape [3] != [T] = [6]");
}

TEST_F(TraceReject, OptionalTensorShapes) {
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"topk_weights", "F32", {kLayers, kTokens, 1}, std::string(48, '\0')});
  expect_tensors_rejected(tensors, "tensor topk_weights: shape");
  tensors = small_tensors();
  tensors.push_back({"layer_ids", "I32", {3}, std::string(12, '\0')});
  expect_tensors_rejected(tensors, "tensor layer_ids: shape");
  tensors = small_tensors();
  tensors.push_back({"token_ids", "I64", {kTokens}, std::string(48, '\0')});
  expect_tensors_rejected(tensors, "tensor token_ids: dtype I64");
}

TEST_F(TraceReject, DataOffsetsOutOfRange) {
  expect_edit_rejected(
      [](Json& h) {
        h["source_rank"]["data_offsets"] = {160, 184};
      },
      "tensor source_rank: data_offsets [160, 184) out of range");
  expect_edit_rejected(
      [](Json& h) {
        h["source_rank"]["data_offsets"] = {-1, 23};
      },
      "not non-negative integers");
  expect_edit_rejected([](Json& h) { h["source_rank"]["data_offsets"] = {0}; }, "[begin, end]");
  expect_edit_rejected(
      [](Json& h) {
        h["source_rank"]["data_offsets"] = {1.5, 24};
      },
      "not non-negative integers");
}

TEST_F(TraceReject, DataOffsetsEndBeforeBegin) {
  expect_edit_rejected(
      [](Json& h) {
        h["source_rank"]["data_offsets"] = {120, 96};
      },
      "tensor source_rank: data_offsets end 96 < begin 120");
}

TEST_F(TraceReject, OverlappingTensors) {
  // step_offsets [96, 120) moved onto the last 24 bytes of topk_ids [0, 96).
  expect_edit_rejected([](Json& h) { h["step_offsets"]["data_offsets"] = {72, 96}; }, "overlap");
}

TEST_F(TraceReject, ByteSizeMismatch) {
  expect_edit_rejected([](Json& h) { h["source_rank"]["shape"] = {5}; },
                       "tensor source_rank: data_offsets span 24 bytes but shape [5] of I32 needs "
                       "20 bytes");
}

TEST_F(TraceReject, ShapeProductOverflow) {
  expect_edit_rejected(
      [](Json& h) {
        h["topk_ids"]["shape"] = {int64_t{1} << 32, int64_t{1} << 32, 2};
      },
      "overflows");
  expect_edit_rejected(
      [](Json& h) {
        h["topk_ids"]["shape"] = {int64_t{1} << 31, int64_t{1} << 31, 2};
      },
      "overflows");
  expect_edit_rejected(
      [](Json& h) {
        h["topk_ids"]["shape"] = {uint64_t{1} << 63, 1, 2};
      },
      "is not an integer in [0, 2^63)");
  expect_edit_rejected(
      [](Json& h) {
        h["topk_ids"]["shape"] = {-2, -3, 2};
      },
      "is not an integer in [0, 2^63)");
}

TEST_F(TraceReject, ExpertIdOutOfRange) {
  std::vector<int32_t> ids = small_ids();
  ids[15] = 8;
  expect_tensors_rejected(with_ids(ids),
                          "tensor topk_ids: layer 1 token 1 slot 1: expert id 8 out of "
                          "range (valid range [0, 8))");
  ids[15] = -1;
  expect_tensors_rejected(with_ids(ids), "expert id -1 out of range");
}

TEST_F(TraceReject, ExpertIdRepeatedWithinRow) {
  std::vector<int32_t> ids = small_ids();
  ids[5] = ids[4];
  expect_tensors_rejected(with_ids(ids), "tensor topk_ids: layer 0 token 2: expert 4 repeated");
}

TEST_F(TraceReject, ExpertIdRepeatedWithLargeTopK) {
  // K > 32 takes the sorting path.
  constexpr int kTopK = 40;
  std::vector<int32_t> ids;
  for (int k = 0; k < kTopK; ++k) ids.push_back(k);
  ids[39] = 7;
  expect_tensors_rejected({{"topk_ids", "I32", {1, 1, kTopK}, bytes_of(ids)}},
                          "expert 7 repeated in slots 7 and 39", trace_meta(64, kTopK));
}

TEST_F(TraceReject, StepOffsetsNotStartingAtZero) {
  expect_tensors_rejected(with_offsets({1, 2, 6}), "first offset 1 must be 0");
}

TEST_F(TraceReject, StepOffsetsDecreasing) {
  expect_tensors_rejected(with_offsets({0, 4, 3, 6}), "offset 2 = 3 decreases");
}

TEST_F(TraceReject, StepOffsetsNotEndingAtT) {
  expect_tensors_rejected(with_offsets({0, 2, 5}),
                          "last offset 5 must equal the number of tokens 6");
  expect_tensors_rejected(with_offsets({0, 2, 7}), "last offset 7");
}

TEST_F(TraceReject, SourceRankOutOfRange) {
  expect_tensors_rejected(with_ranks({0, 0, 1, -1, 2, 2}), "token 3: source rank -1 out of range");
  Json meta = trace_meta();
  meta["num_sources"] = "2";
  expect_tensors_rejected(small_tensors(),
                          "token 4: source rank 2 out of range (valid range [0, 2)", meta);
}

TEST_F(TraceReject, CountsNegative) {
  std::vector<int32_t> counts(1 * 1 * 2 * 8, 1);
  counts[9] = -4;
  expect_tensors_rejected({{"counts", "I32", {1, 1, 2, 8}, bytes_of(counts)}},
                          "tensor counts: entry 9 = -4 is negative");
}

TEST_F(TraceReject, CountsShape) {
  const std::string bytes(4 * 16, '\0');
  expect_tensors_rejected({{"counts", "I32", {1, 1, 2, 7}, bytes.substr(0, 56)}},
                          "E (num_experts) = 7");
  expect_tensors_rejected({{"counts", "I32", {2, 8}, bytes}}, "is not 4-D");
  expect_tensors_rejected({{"counts", "I64", {1, 1, 1, 8}, bytes}}, "dtype I64");
  Json meta = trace_meta();
  meta["num_sources"] = "3";
  expect_tensors_rejected({{"counts", "I32", {1, 1, 2, 8}, bytes}}, "R = 2 out of range", meta);
}

TEST_F(TraceReject, CountsAndTopkIdsTogether) {
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"counts", "I32", {1, 2, 3, 8}, std::string(4 * 48, '\0')});
  expect_tensors_rejected(tensors, "tensor counts: only valid in load-only traces");
}

TEST_F(TraceReject, TokenTensorsInLoadOnlyTrace) {
  expect_tensors_rejected({{"counts", "I32", {1, 1, 1, 8}, std::string(32, '\0')},
                           {"step_offsets", "I64", {2}, bytes_of(std::vector<int64_t>{0, 0})}},
                          "tensor step_offsets: only valid with topk_ids");
}

TEST_F(TraceReject, HostileNamesArePrintedSafely) {
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"bad\nname" + std::string(500, 'x'), "I32", {1}, std::string(4, '\0')});
  expect_tensors_rejected(tensors, "bad\\x0aname");
}

// ---------------------------------------------------------------------------------------------------
// Fuzz: random mutations of a valid file either open cleanly or throw cobalt::Error.

TEST(TraceFuzz, MutationsNeverCrash) {
  TempDir dir;
  std::vector<RawTensor> tensors = small_tensors();
  tensors.push_back({"topk_weights", "F32", {kLayers, kTokens, 2}, std::string(96, '\x3f')});
  tensors.push_back({"layer_ids", "I32", {kLayers}, bytes_of(std::vector<int32_t>{0, 1})});
  Json meta = trace_meta();
  meta["num_sources"] = "3";
  const std::string base = build_file(meta, tensors);
  uint64_t base_header_len = 0;
  std::memcpy(&base_header_len, base.data(), 8);
  const std::string base_header = base.substr(8, base_header_len);
  const std::string base_data = base.substr(8 + base_header_len);

  const std::vector<std::pair<std::string, std::vector<std::string>>> edits = {
      {"I32", {"I16", "I64", "F32", "BF16", "U8"}},
      {"I64", {"I32", "I16"}},
      {"topk_ids", {"counts", "token_ids", "topk_idz", "layer_ids"}},
      {"step_offsets", {"source_rank", "counts", "topk_weights"}},
      {"source_rank", {"token_ids", "step_offsets"}},
      {"\"shape\"", {"\"shap\"", "\"dtype\""}},
      {"data_offsets", {"data_offset", "shape"}},
      {"__metadata__", {"__metadata_", "topk_ids"}},
      {"cobalt-trace", {"cobalt", ""}},
      {"{", {"[", "{{", ""}},
      {"]", {"}", ",]", ""}},
      {",", {"", ",,", ":"}},
  };
  const std::vector<std::string> numbers = {"0",
                                            "1",
                                            "2",
                                            "-1",
                                            "3",
                                            "7",
                                            "8",
                                            "9",
                                            "48",
                                            "96",
                                            "97",
                                            "1e3",
                                            "2.5",
                                            "4294967296",
                                            "9223372036854775807",
                                            "18446744073709551615",
                                            "99999999999999999999999"};

  std::mt19937_64 rng(20240531);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::string path = dir.file("fuzz.safetensors");
  int num_accepted = 0;
  int num_rejected = 0;
  constexpr int kIterations = 3000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::string bytes;
    std::string header = base_header;
    std::string data = base_data;
    const size_t op = pick(7);
    if (op == 4 || op == 5) {  // header text edits, length prefix kept consistent
      for (size_t n = 1 + pick(2); n > 0; --n) {
        if (op == 4) {  // replace a run of digits (a number) with another number
          std::vector<size_t> starts;
          for (size_t i = 0; i < header.size(); ++i) {
            if (std::isdigit(static_cast<unsigned char>(header[i])) &&
                (i == 0 || !std::isdigit(static_cast<unsigned char>(header[i - 1])))) {
              starts.push_back(i);
            }
          }
          const size_t begin = starts[pick(starts.size())];
          size_t end = begin;
          while (end < header.size() && std::isdigit(static_cast<unsigned char>(header[end])))
            ++end;
          header.replace(begin, end - begin, numbers[pick(numbers.size())]);
        } else {
          const auto& [from, tos] = edits[pick(edits.size())];
          const size_t at = header.find(from, pick(header.size()));
          const size_t where = at != std::string::npos ? at : header.find(from);
          if (where != std::string::npos) header.replace(where, from.size(), tos[pick(tos.size())]);
        }
      }
      bytes = raw_file(header, data);
    } else {
      bytes = raw_file(header, data);
      switch (op) {
        case 0:  // random bytes anywhere
          for (size_t n = 1 + pick(4); n > 0; --n)
            bytes[pick(bytes.size())] = static_cast<char>(rng());
          break;
        case 1:  // random bytes in the header text
          for (size_t n = 1 + pick(3); n > 0; --n) {
            bytes[8 + pick(header.size())] = static_cast<char>(rng());
          }
          break;
        case 2:  // truncation
          bytes.resize(pick(bytes.size()));
          break;
        case 3: {  // length prefix
          uint64_t len = base_header_len;
          const size_t how = pick(3);
          len = how == 0 ? rng() : how == 1 ? len + pick(16) - 8 : len ^ (uint64_t{1} << pick(64));
          std::memcpy(bytes.data(), &len, 8);
          break;
        }
        default: {  // small values written over the data section (ids, offsets, ranks)
          const size_t data_begin = 8 + header.size();
          for (size_t n = 1 + pick(2); n > 0; --n) {
            const size_t at = data_begin + 4 * pick(data.size() / 4);
            const int32_t value = static_cast<int32_t>(pick(12)) - 2;
            std::memcpy(bytes.data() + at, &value, 4);
          }
          break;
        }
      }
    }
    write_file(path, bytes);
    try {
      const TraceReader reader(path);
      touch_everything(reader);
      ++num_accepted;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ++num_rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << " (op " << op << "): non-cobalt exception "
                    << e.what();
    }
  }
  EXPECT_EQ(num_accepted + num_rejected, kIterations);
  EXPECT_GT(num_accepted, 50);
  EXPECT_GT(num_rejected, kIterations / 2);
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
