// cobalt-trace v1: one test per kind of malformed input.
#include <fmt/format.h>

#include <cerrno>
#include <utility>

#include "io/trace_fixtures.hpp"

namespace cobalt::io {
namespace {

using namespace test_support;  // NOLINT(build/namespaces): test helpers

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
      // The JSON library's own tags ("[json.exception.parse_error.101]") mean nothing to users.
      EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
      EXPECT_LT(message.size(), 600u) << message;
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
  // The small valid trace's JSON header text and data section, for edits of the raw text.
  static std::pair<std::string, std::string> valid_header_and_data() {
    const std::string ok = build_file(trace_meta(), small_tensors());
    uint64_t len = 0;
    std::memcpy(&len, ok.data(), 8);
    return {ok.substr(8, len), ok.substr(8 + len)};
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
  // An IoError carrying the open's errno (Python raises it as a FileNotFoundError).
  try {
    TraceReader reader(dir_.file("nope.safetensors"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(e.os_errno(), ENOENT);
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
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
  expect_rejected(raw_file(std::string("{\"a\0\": 1}", 9), ""), "NUL byte at offset 3");
  expect_rejected(raw_file("{\"\xff\": 1}", ""), "invalid JSON");
  expect_rejected(raw_file("{\"a\":tru}", ""), "invalid JSON: parse error at line 1, column 9");
  // A number beyond double range is valid JSON the reader cannot hold: said so, not its 400
  // digits.
  expect_rejected(raw_file("{\"a\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [" +
                               std::string(400, '9') + ", 4]}}",
                           ""),
                  "a number literal is beyond double range");
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
  // 65537 and 2^31-1 are integers but beyond kMaxExperts (a 1 KB file must not allocate GBs).
  for (const char* bad :
       {"0", "-3", "eight", "8.0", "", " 8", "99999999999", "65537", "2147483647"}) {
    Json meta = trace_meta();
    meta["num_experts"] = bad;
    expect_tensors_rejected(small_tensors(), "num_experts", meta);
  }
  // What is wrong is named: not an integer at all, or an integer out of range.
  for (const char* bad : {"eight", "8.0", "", " 8", "+8", "nan"}) {
    Json meta = trace_meta();
    meta["num_experts"] = bad;
    expect_tensors_rejected(small_tensors(), "is not an integer (an integer in [1, 65536])", meta);
  }
  for (const char* bad : {"0", "-3", "65537", "99999999999"}) {
    Json meta = trace_meta();
    meta["num_experts"] = bad;
    expect_tensors_rejected(small_tensors(), "out of range (an integer in [1, 65536])", meta);
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

// The safetensors rule: the data buffer is entirely indexed (no holes, no trailing bytes), so a
// file cannot carry bytes that no tensor owns.
TEST_F(TraceReject, BytesThatNoTensorOwns) {
  std::string trailing = build_file(trace_meta(), small_tensors());
  expect_rejected(trailing + "junk", "4 bytes after the last tensor belong to no tensor");
  std::vector<RawTensor> tensors = small_tensors();
  tensors.insert(tensors.begin() + 1, RawTensor{"pad", "U8", {8}, std::string(8, 'x')});
  std::string with_gap = build_file(trace_meta(), tensors, [](Json& h) { h.erase("pad"); });
  expect_rejected(with_gap, "belong to no tensor");
  // An empty tensor inside another tensor's bytes (not at the running offset).
  std::vector<RawTensor> with_empty = small_tensors();
  with_empty.push_back(RawTensor{"empty", "U8", {0}, ""});
  expect_rejected(build_file(trace_meta(), with_empty,
                             [](Json& h) {
                               h["empty"]["data_offsets"] = {4, 4};
                             }),
                  "tensor empty: data_offsets [4, 4) lie inside another tensor's bytes");
}

// A key twice in one JSON object would be read as whichever came last.
TEST_F(TraceReject, DuplicateHeaderKeys) {
  auto [header, data] = valid_header_and_data();
  // Repeat the metadata's "format" key (same value: still refused).
  const auto at = header.find("\"format\"");
  ASSERT_NE(at, std::string::npos);
  header.insert(at, "\"format\":\"cobalt-trace\",");
  expect_rejected(raw_file(header, data), "key format appears twice");
}

// A shape nested 100,000 levels deep crashed the reader (stack overflow printing it for the error
// message); nesting is refused before the header is built.
TEST_F(TraceReject, DeeplyNestedHeader) {
  auto [header, data] = valid_header_and_data();
  const std::string shallow_base = header;
  const auto at = header.find("\"shape\":[");
  ASSERT_NE(at, std::string::npos);
  const size_t open = at + std::string("\"shape\":[").size();
  const int levels = 100000;
  std::string nested = std::string(levels, '[') + "1" + std::string(levels, ']') + ",";
  header.insert(open, nested);
  expect_rejected(raw_file(header, data), "header: JSON nested more than 16 levels deep");
  // Within the limit, a nested shape element is named in one line.
  std::string shallow = shallow_base;
  shallow.insert(shallow.find("\"shape\":[") + std::string("\"shape\":[").size(), "[[1]],");
  expect_rejected(raw_file(shallow, data), "is not an integer in [0, 2^63)");
}

// nlohmann skips a UTF-8 byte order mark, which no safetensors reader accepts.
TEST_F(TraceReject, ByteOrderMarkBeforeHeader) {
  auto [header, data] = valid_header_and_data();
  expect_rejected(raw_file("\xEF\xBB\xBF" + header, data), "starts with a UTF-8 byte order mark");
}

// nlohmann's reader ends at a NUL byte: what follows it was accepted unread.
TEST_F(TraceReject, NulByteInHeader) {
  auto [header, data] = valid_header_and_data();
  const size_t len = header.size();
  header += std::string(1, '\0') + "garbage";
  expect_rejected(raw_file(header, data), "NUL byte at offset " + std::to_string(len));
}

// A header of many entries: refused once parsed (the duplicate check used to make the parse
// quadratic in the number of entries: minutes at 200,000).
TEST_F(TraceReject, HeaderWithManyEntries) {
  auto [header, data] = valid_header_and_data();
  std::string extra;
  for (int i = 0; i < 50000; ++i) {
    extra += fmt::format("\"x{}\":{{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}},", i);
  }
  header.insert(1, extra);
  expect_rejected(raw_file(header, data), "unknown tensor (valid names:");
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
  expect_tensors_rejected(with_offsets({0, 2, 7}), "offset 2 = 7 out of range [0, 6]");
  // A huge middle offset is named itself (the decrease after it is a consequence).
  expect_tensors_rejected(with_offsets({0, int64_t{1} << 62, 6}),
                          "offset 1 = 4611686018427387904 out of range [0, 6]");
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

}  // namespace
}  // namespace cobalt::io
