// Helpers shared by the trace I/O tests: a scratch directory, hand-built safetensors files, the
// small valid trace the tests mutate, and a reader that touches every view.
#pragma once

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
#include "cobalt/io/trace.hpp"

namespace cobalt::io::test_support {

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

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// 8-byte length + header text (padded with `pad` spaces) + data.
inline std::string raw_file(const std::string& header, const std::string& data, size_t pad = 0) {
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
inline std::string build_file(const Json& metadata, const std::vector<RawTensor>& tensors,
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

inline Json trace_meta(int num_experts = 8, int top_k = 2) {
  return {{"format", "cobalt-trace"},
          {"version", "1"},
          {"num_experts", std::to_string(num_experts)},
          {"top_k", std::to_string(top_k)}};
}

// A valid small token trace: E = 8, K = 2, L = 2, T = 6, steps {0, 2, 6}, 3 sources.
constexpr int kLayers = 2;
constexpr int64_t kTokens = 6;
inline std::vector<int32_t> small_ids() {
  return {0, 1, 2, 3, 4, 5, 6, 7, 7, 0, 3, 5,   // layer 0
          1, 0, 3, 2, 5, 4, 7, 6, 0, 7, 5, 3};  // layer 1
}
inline std::vector<RawTensor> small_tensors() {
  return {{"topk_ids", "I32", {kLayers, kTokens, 2}, bytes_of(small_ids())},
          {"step_offsets", "I64", {3}, bytes_of(std::vector<int64_t>{0, 2, 6})},
          {"source_rank", "I32", {kTokens}, bytes_of(std::vector<int32_t>{0, 0, 1, 1, 2, 2})}};
}

inline TraceData small_data() {
  TraceData data;
  data.num_experts = 8;
  data.top_k = 2;
  data.num_layers = kLayers;
  data.num_tokens = kTokens;
  data.topk_ids = small_ids();
  return data;
}

// Opens `path` and touches every view (what a replay would do); returns the number of ids seen.
inline int64_t touch_everything(const TraceReader& reader) {
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

}  // namespace cobalt::io::test_support
