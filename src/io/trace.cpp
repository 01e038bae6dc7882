#include "cobalt/io/trace.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "cobalt/core/error.hpp"
#include "cobalt/io/safetensors.hpp"

namespace cobalt::io {

namespace {

constexpr std::string_view kFormat = "cobalt-trace";
constexpr std::string_view kVersion = "1";
constexpr std::array<std::string_view, 7> kTensorNames = {
    "topk_ids", "step_offsets", "source_rank", "topk_weights", "layer_ids", "token_ids", "counts"};
constexpr std::array<std::string_view, 5> kReservedKeys = {"format", "version", "num_experts",
                                                           "top_k", "num_sources"};
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Rows validated (or widened) per chunk when streaming over the mapping.
constexpr int64_t kChunkRows = int64_t{1} << 15;

std::string context_of(const std::string& path) { return "trace " + printable(path, 200); }

// A metadata value that must be an int in [1, max_value] (decimal digits). nullopt when absent and
// optional.
std::optional<int> metadata_int(const std::map<std::string, std::string>& metadata,
                                std::string_view key, bool required, std::string_view context,
                                int64_t max_value) {
  const auto it = metadata.find(std::string(key));
  if (it == metadata.end()) {
    COBALT_CHECK_ARG(!required, "{}: __metadata__: {} missing (a positive integer string)", context,
                     key);
    return std::nullopt;
  }
  const std::string& text = it->second;
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // Plain decimal digits only (from_chars also takes a leading '-'): " 8", "+8", "8.0" and "nan"
  // are not integers; a number of digits outside the range is out of range.
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(),
                                                   [](char c) { return c >= '0' && c <= '9'; });
  COBALT_CHECK_ARG(digits || (text.size() > 1 && text[0] == '-' &&
                              std::all_of(text.begin() + 1, text.end(),
                                          [](char c) { return c >= '0' && c <= '9'; })),
                   "{}: __metadata__: {} = \"{}\" is not an integer (an integer in [1, {}])",
                   context, key, printable(text), max_value);
  COBALT_CHECK_ARG(
      ec == std::errc() && ptr == text.data() + text.size() && value >= 1 && value <= max_value,
      "{}: __metadata__: {} = \"{}\" out of range (an integer in [1, {}])", context, key,
      printable(text), max_value);
  return value;
}

template <typename T>
std::span<const T> view_as(std::span<const std::byte> bytes, std::vector<T>& scratch) {
  const size_t count = bytes.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    return {reinterpret_cast<const T*>(bytes.data()), count};
  }
  scratch.resize(count);
  if (count > 0) std::memcpy(scratch.data(), bytes.data(), count * sizeof(T));
  return scratch;
}

// Expert ids from I32 or I16 bytes; zero-copy for aligned I32.
std::span<const ExpertId> view_ids(std::span<const std::byte> bytes, Dtype dtype,
                                   std::vector<ExpertId>& scratch) {
  if (dtype == Dtype::kI32) return view_as<ExpertId>(bytes, scratch);
  const size_t count = bytes.size() / sizeof(int16_t);
  scratch.resize(count);
  for (size_t i = 0; i < count; ++i) {
    int16_t value = 0;
    std::memcpy(&value, bytes.data() + i * sizeof(int16_t), sizeof(int16_t));
    scratch[i] = value;
  }
  return scratch;
}

// Rows of K expert ids of `layer`, tokens first_token..: every id in [0, E), distinct within a row.
void check_topk_rows(std::span<const ExpertId> ids, int top_k, int num_experts, int layer,
                     int64_t first_token, std::string_view context) {
  const size_t num_rows = ids.size() / static_cast<size_t>(top_k);
  std::vector<ExpertId> sorted;
  for (size_t row_idx = 0; row_idx < num_rows; ++row_idx) {
    const ExpertId* row = ids.data() + row_idx * top_k;
    const int64_t token_idx = first_token + static_cast<int64_t>(row_idx);
    for (int k = 0; k < top_k; ++k) {
      COBALT_CHECK_ARG(row[k] >= 0 && row[k] < num_experts,
                       "{}: tensor topk_ids: layer {} token {} slot {}: expert id {} out of range "
                       "(valid range [0, {}))",
                       context, layer, token_idx, k, row[k], num_experts);
    }
    bool distinct = true;
    if (top_k <= 32) {
      for (int k = 1; k < top_k && distinct; ++k) {
        for (int j = 0; j < k; ++j) distinct &= row[j] != row[k];
      }
    } else {
      sorted.assign(row, row + top_k);
      std::sort(sorted.begin(), sorted.end());
      distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    }
    if (distinct) continue;
    for (int k = 1; k < top_k; ++k) {
      for (int j = 0; j < k; ++j) {
        COBALT_CHECK_ARG(row[j] != row[k],
                         "{}: tensor topk_ids: layer {} token {}: expert {} repeated in slots {} "
                         "and {} (ids must be distinct within a row)",
                         context, layer, token_idx, row[k], j, k);
      }
    }
  }
}

void check_step_offsets(std::span<const int64_t> offsets, int64_t num_tokens,
                        std::string_view context) {
  COBALT_CHECK_ARG(
      offsets.size() >= 2 && static_cast<int64_t>(offsets.size()) - 1 <= kIntMax,
      "{}: tensor step_offsets: {} entries (valid range [2, {}]: S + 1 for S >= 1 steps)", context,
      offsets.size(), kIntMax + 1);
  COBALT_CHECK_ARG(offsets.front() == 0, "{}: tensor step_offsets: first offset {} must be 0",
                   context, offsets.front());
  for (size_t step_idx = 1; step_idx < offsets.size(); ++step_idx) {
    COBALT_CHECK_ARG(offsets[step_idx] >= 0 && offsets[step_idx] <= num_tokens,
                     "{}: tensor step_offsets: offset {} = {} out of range [0, {}] (the tokens)",
                     context, step_idx, offsets[step_idx], num_tokens);
    COBALT_CHECK_ARG(offsets[step_idx] >= offsets[step_idx - 1],
                     "{}: tensor step_offsets: offset {} = {} decreases (valid range [{}, {}])",
                     context, step_idx, offsets[step_idx], offsets[step_idx - 1], num_tokens);
  }
  COBALT_CHECK_ARG(offsets.back() == num_tokens,
                   "{}: tensor step_offsets: last offset {} must equal the number of tokens {}",
                   context, offsets.back(), num_tokens);
}

// Source ranks in [0, num_sources) (or [0, kMaxSources) when num_sources is 0); returns the
// largest.
RankId check_source_ranks(std::span<const RankId> ranks, int64_t first_token, int num_sources,
                          std::string_view context) {
  const int64_t limit = num_sources > 0 ? num_sources : kMaxSources;
  RankId max_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    COBALT_CHECK_ARG(
        ranks[i] >= 0 &&
                ranks[i]<
                    limit,
                    "{}: tensor source_rank: token {}: source rank {} out of range (valid range "
                    "[0, {}){})",
                    context, first_token + static_cast<int64_t>(i), ranks[i], limit, num_sources> 0
            ? ", num_sources"
            : "");
    max_rank = std::max(max_rank, ranks[i]);
  }
  return max_rank;
}

void check_counts(std::span<const int32_t> counts, int64_t first_idx, std::string_view context) {
  for (size_t i = 0; i < counts.size(); ++i) {
    COBALT_CHECK_ARG(counts[i] >= 0,
                     "{}: tensor counts: entry {} = {} is negative (valid range [0, {}])", context,
                     first_idx + static_cast<int64_t>(i), counts[i], kIntMax);
  }
}

// Checks the dtype of `tensor` is one of `allowed`.
void check_dtype(const TensorInfo& tensor, std::initializer_list<Dtype> allowed,
                 std::string_view context) {
  if (std::find(allowed.begin(), allowed.end(), tensor.dtype) != allowed.end()) return;
  std::string names;
  for (const Dtype dtype : allowed)
    names += (names.empty() ? "" : " or ") + std::string(dtype_name(dtype));
  fail(ErrorCode::kInvalidArgument, "{}: tensor {}: dtype {} not supported (valid: {})", context,
       tensor.name, dtype_name(tensor.dtype), names);
}

void check_shape(const TensorInfo& tensor, const std::vector<int64_t>& expected,
                 std::string_view what, std::string_view context) {
  COBALT_CHECK_ARG(tensor.shape == expected, "{}: tensor {}: shape {} != {} {}", context,
                   tensor.name, shape_text(tensor.shape), what, shape_text(expected));
}

// Checks one dimension of a tensor's shape lies in [lo, hi].
int64_t check_dim(const TensorInfo& tensor, size_t dim_idx, std::string_view dim_name, int64_t lo,
                  int64_t hi, std::string_view context) {
  const int64_t value = tensor.shape[dim_idx];
  COBALT_CHECK_ARG(value >= lo && value <= hi,
                   "{}: tensor {}: shape {}: {} = {} out of range (valid range [{}, {}])", context,
                   tensor.name, shape_text(tensor.shape), dim_name, value, lo, hi);
  return value;
}

void check_rank(const TensorInfo& tensor, size_t rank, std::string_view layout,
                std::string_view context) {
  COBALT_CHECK_ARG(tensor.shape.size() == rank, "{}: tensor {}: shape {} is not {}-D (expected {})",
                   context, tensor.name, shape_text(tensor.shape), rank, layout);
}

bool is_reserved(std::string_view key) {
  return std::find(kReservedKeys.begin(), kReservedKeys.end(), key) != kReservedKeys.end();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Writer

namespace {
void validate_metadata(const std::map<std::string, std::string>& metadata,
                       std::string_view context);
}  // namespace

void validate_trace_data(const TraceData& data, std::string_view context) {
  validate_trace_data(data, data.metadata, context);
}

void validate_trace_data(const TraceData& data, const std::map<std::string, std::string>& metadata,
                         std::string_view context) {
  COBALT_CHECK_ARG(data.num_experts >= 1 && data.num_experts <= kMaxExperts,
                   "{}: __metadata__: num_experts {} (valid range [1, {}])", context,
                   data.num_experts, kMaxExperts);
  COBALT_CHECK_ARG(data.top_k >= 1 && data.top_k <= data.num_experts,
                   "{}: __metadata__: top_k {} out of range (valid range [1, {}])", context,
                   data.top_k, data.num_experts);
  COBALT_CHECK_ARG(data.num_sources >= 0 && data.num_sources <= kMaxSources,
                   "{}: __metadata__: num_sources {} out of range (valid range [0, {}])", context,
                   data.num_sources, kMaxSources);
  COBALT_CHECK_ARG(data.num_layers >= 1, "{}: num_layers {} out of range (valid range [1, {}])",
                   context, data.num_layers, kIntMax);

  if (!data.counts.empty()) {
    COBALT_CHECK_ARG(data.topk_ids.empty() && data.source_rank.empty() &&
                         data.step_offsets.empty() && data.num_tokens == 0,
                     "{}: tensor counts: load-only traces carry no topk_ids, source_rank, "
                     "step_offsets or tokens",
                     context);
    COBALT_CHECK_ARG(data.num_count_steps >= 1,
                     "{}: tensor counts: num_count_steps {} out of range (valid range [1, {}])",
                     context, data.num_count_steps, kIntMax);
    COBALT_CHECK_ARG(data.num_sources >= 1,
                     "{}: tensor counts: num_sources {} out of range (valid range [1, {}])",
                     context, data.num_sources, kIntMax);
    uint64_t product = 1;
    bool overflow = false;
    for (const int factor :
         {data.num_count_steps, data.num_layers, data.num_sources, data.num_experts}) {
      overflow |= __builtin_mul_overflow(product, static_cast<uint64_t>(factor), &product);
    }
    COBALT_CHECK_ARG(!overflow && product == data.counts.size(),
                     "{}: tensor counts: {} entries != S*L*R*E = {}*{}*{}*{}", context,
                     data.counts.size(), data.num_count_steps, data.num_layers, data.num_sources,
                     data.num_experts);
    check_counts(data.counts, 0, context);
  } else {
    COBALT_CHECK_ARG(data.num_tokens >= 1,
                     "{}: tensor topk_ids: num_tokens {} out of range (valid range [1, 2^63))",
                     context, data.num_tokens);
    uint64_t expected = 0;
    const bool overflow =
        __builtin_mul_overflow(static_cast<uint64_t>(data.num_layers),
                               static_cast<uint64_t>(data.num_tokens), &expected) ||
        __builtin_mul_overflow(expected, static_cast<uint64_t>(data.top_k), &expected);
    COBALT_CHECK_ARG(!overflow && expected == data.topk_ids.size(),
                     "{}: tensor topk_ids: {} ids != L*T*K = {}*{}*{} (missing unless counts is "
                     "present)",
                     context, data.topk_ids.size(), data.num_layers, data.num_tokens, data.top_k);
    const size_t layer_size = static_cast<size_t>(data.num_tokens) * data.top_k;
    for (int layer = 0; layer < data.num_layers; ++layer) {
      check_topk_rows(std::span(data.topk_ids).subspan(layer * layer_size, layer_size), data.top_k,
                      data.num_experts, layer, 0, context);
    }
    if (!data.step_offsets.empty()) check_step_offsets(data.step_offsets, data.num_tokens, context);
    if (!data.source_rank.empty()) {
      COBALT_CHECK_ARG(static_cast<int64_t>(data.source_rank.size()) == data.num_tokens,
                       "{}: tensor source_rank: {} entries != num_tokens {}", context,
                       data.source_rank.size(), data.num_tokens);
      check_source_ranks(data.source_rank, 0, data.num_sources, context);
    }
  }
  validate_metadata(metadata, context);
}

namespace {
void validate_metadata(const std::map<std::string, std::string>& metadata,
                       std::string_view context) {
  for (const auto& [key, value] : metadata) {
    COBALT_CHECK_ARG(!is_reserved(key) || key == "format" || key == "version",
                     "{}: __metadata__: key {} is reserved (set the TraceData field instead)",
                     context, printable(key));
    COBALT_CHECK_ARG(key != "format" || value == kFormat,
                     "{}: __metadata__: format \"{}\" (valid: \"{}\")", context, printable(value),
                     kFormat);
    COBALT_CHECK_ARG(key != "version" || value == kVersion,
                     "{}: __metadata__: version \"{}\" (valid: \"{}\")", context, printable(value),
                     kVersion);
  }
}
}  // namespace

void write_trace(const std::string& path, const TraceData& data) {
  write_trace(path, data, data.metadata);
}

void write_trace(const std::string& path, const TraceData& data,
                 const std::map<std::string, std::string>& user_metadata) {
  const std::string context = context_of(path);
  validate_trace_data(data, user_metadata, context);

  std::map<std::string, std::string> metadata = user_metadata;
  metadata["format"] = kFormat;
  metadata["version"] = kVersion;
  metadata["num_experts"] = std::to_string(data.num_experts);
  metadata["top_k"] = std::to_string(data.top_k);
  int num_sources = data.num_sources;
  if (num_sources == 0 && !data.source_rank.empty()) {
    num_sources = *std::max_element(data.source_rank.begin(), data.source_rank.end()) + 1;
  }
  if (num_sources > 0) metadata["num_sources"] = std::to_string(num_sources);

  std::vector<TensorToWrite> tensors;
  const std::vector<int64_t> one_step = {0, data.num_tokens};
  if (data.counts.empty()) {
    const std::vector<int64_t>& offsets = data.step_offsets.empty() ? one_step : data.step_offsets;
    tensors.push_back({"topk_ids",
                       Dtype::kI32,
                       {data.num_layers, data.num_tokens, data.top_k},
                       std::as_bytes(std::span(data.topk_ids))});
    tensors.push_back({"step_offsets",
                       Dtype::kI64,
                       {static_cast<int64_t>(offsets.size())},
                       std::as_bytes(std::span(offsets))});
    if (!data.source_rank.empty()) {
      tensors.push_back({"source_rank",
                         Dtype::kI32,
                         {data.num_tokens},
                         std::as_bytes(std::span(data.source_rank))});
    }
  } else {
    tensors.push_back({"counts",
                       Dtype::kI32,
                       {data.num_count_steps, data.num_layers, data.num_sources, data.num_experts},
                       std::as_bytes(std::span(data.counts))});
  }
  write_safetensors(path, metadata, tensors, context);
}

// ---------------------------------------------------------------------------------------------------
// Reader

struct TraceReader::Impl {
  std::string path;
  std::string context;
  MappedFile file;
  std::map<std::string, std::string> metadata;
  int num_experts = 0;
  int top_k = 0;
  int num_layers = 0;
  int64_t num_tokens = 0;
  int num_sources = 0;
  std::vector<int64_t> step_offsets;  // [S + 1]
  Dtype topk_dtype = Dtype::kI32;
  std::span<const std::byte> topk_bytes;  // empty for load-only traces
  bool has_topk = false;
  std::span<const std::byte> source_bytes;
  bool has_source = false;
  std::span<const std::byte> counts_bytes;
  bool has_counts = false;

  void open();
  void validate_topk_contents() const;
};

void TraceReader::Impl::open() {
  file = MappedFile(path, context);
  const SafetensorsHeader header = parse_safetensors_header(file.bytes(), context);

  COBALT_CHECK_ARG(header.has_metadata,
                   "{}: __metadata__: missing (needs format, version, num_experts, top_k)",
                   context);
  metadata = header.metadata;
  const auto format = metadata.find("format");
  COBALT_CHECK_ARG(format != metadata.end() && format->second == kFormat,
                   "{}: __metadata__: format {} (valid: \"{}\")", context,
                   format == metadata.end() ? "missing" : "\"" + printable(format->second) + "\"",
                   kFormat);
  const auto version = metadata.find("version");
  COBALT_CHECK_ARG(version != metadata.end(), "{}: __metadata__: version missing (valid: \"{}\")",
                   context, kVersion);
  COBALT_CHECK_ARG(version->second == kVersion,
                   "{}: __metadata__: version \"{}\" not supported (valid: \"{}\")", context,
                   printable(version->second), kVersion);
  num_experts = *metadata_int(metadata, "num_experts", true, context, kMaxExperts);
  top_k = *metadata_int(metadata, "top_k", true, context, kIntMax);
  COBALT_CHECK_ARG(top_k <= num_experts,
                   "{}: __metadata__: top_k {} out of range (valid range [1, {}], num_experts)",
                   context, top_k, num_experts);
  const std::optional<int> meta_sources =
      metadata_int(metadata, "num_sources", false, context, kMaxSources);

  for (const TensorInfo& tensor : header.tensors) {
    COBALT_CHECK_ARG(
        std::find(kTensorNames.begin(), kTensorNames.end(), tensor.name) != kTensorNames.end(),
        "{}: tensor {}: unknown tensor (valid names: {})", context, printable(tensor.name),
        fmt::join(kTensorNames, ", "));
  }
  const TensorInfo* topk = header.find("topk_ids");
  const TensorInfo* counts = header.find("counts");
  const auto requires_topk = [&](const TensorInfo* tensor) {
    COBALT_CHECK_ARG(tensor == nullptr || topk != nullptr,
                     "{}: tensor {}: only valid with topk_ids (not in load-only traces)", context,
                     tensor == nullptr ? "" : tensor->name);
  };

  if (topk != nullptr) {
    COBALT_CHECK_ARG(counts == nullptr,
                     "{}: tensor counts: only valid in load-only traces (this one has topk_ids)",
                     context);
    check_dtype(*topk, {Dtype::kI32, Dtype::kI16}, context);
    check_rank(*topk, 3, "[L, T, K]", context);
    num_layers = static_cast<int>(check_dim(*topk, 0, "L", 1, kIntMax, context));
    num_tokens = check_dim(*topk, 1, "T", 1, std::numeric_limits<int64_t>::max(), context);
    check_dim(*topk, 2, "K (top_k)", top_k, top_k, context);
    topk_dtype = topk->dtype;
    topk_bytes = tensor_bytes(file.bytes(), header, *topk);
    has_topk = true;
  } else {
    COBALT_CHECK_ARG(counts != nullptr,
                     "{}: tensor topk_ids: missing (required unless counts is present)", context);
    check_dtype(*counts, {Dtype::kI32}, context);
    check_rank(*counts, 4, "[S, L, R, E]", context);
    const int num_count_steps = static_cast<int>(check_dim(*counts, 0, "S", 1, kIntMax, context));
    num_layers = static_cast<int>(check_dim(*counts, 1, "L", 1, kIntMax, context));
    const int64_t lo_sources = meta_sources.value_or(1);
    const int64_t hi_sources = meta_sources.has_value() ? *meta_sources : kMaxSources;
    num_sources = static_cast<int>(check_dim(*counts, 2, "R", lo_sources, hi_sources, context));
    check_dim(*counts, 3, "E (num_experts)", num_experts, num_experts, context);
    counts_bytes = tensor_bytes(file.bytes(), header, *counts);
    has_counts = true;
    step_offsets.assign(static_cast<size_t>(num_count_steps) + 1, 0);
  }

  if (const TensorInfo* offsets = header.find("step_offsets")) {
    requires_topk(offsets);
    check_dtype(*offsets, {Dtype::kI64}, context);
    check_rank(*offsets, 1, "[S + 1]", context);
    check_dim(*offsets, 0, "S + 1", 2, kIntMax + 1, context);
    const std::span<const std::byte> bytes = tensor_bytes(file.bytes(), header, *offsets);
    step_offsets.resize(bytes.size() / sizeof(int64_t));
    std::memcpy(step_offsets.data(), bytes.data(), bytes.size());
    check_step_offsets(step_offsets, num_tokens, context);
  } else if (has_topk) {
    step_offsets = {0, num_tokens};
  }

  if (const TensorInfo* source = header.find("source_rank")) {
    requires_topk(source);
    check_dtype(*source, {Dtype::kI32}, context);
    check_shape(*source, {num_tokens}, "[T] =", context);
    source_bytes = tensor_bytes(file.bytes(), header, *source);
    has_source = true;
    std::vector<RankId> scratch;
    RankId max_rank = -1;
    const size_t chunk_bytes = kChunkRows * sizeof(RankId);
    for (size_t offset = 0; offset < source_bytes.size(); offset += chunk_bytes) {
      const auto chunk =
          source_bytes.subspan(offset, std::min(chunk_bytes, source_bytes.size() - offset));
      max_rank =
          std::max(max_rank, check_source_ranks(view_as<RankId>(chunk, scratch),
                                                static_cast<int64_t>(offset / sizeof(RankId)),
                                                meta_sources.value_or(0), context));
    }
    num_sources = meta_sources.value_or(max_rank + 1);
  } else if (!has_counts) {
    num_sources = meta_sources.value_or(0);
  }

  if (const TensorInfo* weights = header.find("topk_weights")) {
    requires_topk(weights);
    check_dtype(*weights, {Dtype::kF32, Dtype::kBF16}, context);
    check_shape(*weights, topk->shape, "topk_ids shape", context);
  }
  if (const TensorInfo* layer_ids = header.find("layer_ids")) {
    check_dtype(*layer_ids, {Dtype::kI32}, context);
    check_shape(*layer_ids, {num_layers}, "[L] =", context);
  }
  if (const TensorInfo* token_ids = header.find("token_ids")) {
    requires_topk(token_ids);
    check_dtype(*token_ids, {Dtype::kI32}, context);
    check_shape(*token_ids, {num_tokens}, "[T] =", context);
  }

  if (has_topk) validate_topk_contents();
  if (has_counts) {
    std::vector<int32_t> scratch;
    const size_t chunk_bytes = kChunkRows * sizeof(int32_t);
    for (size_t offset = 0; offset < counts_bytes.size(); offset += chunk_bytes) {
      const auto chunk =
          counts_bytes.subspan(offset, std::min(chunk_bytes, counts_bytes.size() - offset));
      check_counts(view_as<int32_t>(chunk, scratch), static_cast<int64_t>(offset / sizeof(int32_t)),
                   context);
    }
  }
}

void TraceReader::Impl::validate_topk_contents() const {
  std::vector<ExpertId> scratch;
  const size_t row_bytes = static_cast<size_t>(top_k) * dtype_size(topk_dtype);
  for (int layer = 0; layer < num_layers; ++layer) {
    for (int64_t begin = 0; begin < num_tokens; begin += kChunkRows) {
      const int64_t end = std::min(num_tokens, begin + kChunkRows);
      const size_t offset = (static_cast<size_t>(layer) * num_tokens + begin) * row_bytes;
      const auto chunk = topk_bytes.subspan(offset, static_cast<size_t>(end - begin) * row_bytes);
      check_topk_rows(view_ids(chunk, topk_dtype, scratch), top_k, num_experts, layer, begin,
                      context);
    }
  }
}

TraceReader::TraceReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->context = context_of(path);
  impl_->open();
}

TraceReader::~TraceReader() = default;
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;

const std::string& TraceReader::path() const { return impl_->path; }
int TraceReader::num_experts() const { return impl_->num_experts; }
int TraceReader::top_k() const { return impl_->top_k; }
int TraceReader::num_layers() const { return impl_->num_layers; }
int64_t TraceReader::num_tokens() const { return impl_->num_tokens; }
int TraceReader::num_steps() const { return static_cast<int>(impl_->step_offsets.size()) - 1; }
bool TraceReader::has_token_ids() const { return impl_->has_topk; }
bool TraceReader::has_source_rank() const { return impl_->has_source; }
int TraceReader::num_sources() const { return impl_->num_sources; }
bool TraceReader::has_counts() const { return impl_->has_counts; }
std::span<const int64_t> TraceReader::step_offsets() const { return impl_->step_offsets; }
const std::map<std::string, std::string>& TraceReader::metadata() const { return impl_->metadata; }

std::span<const ExpertId> TraceReader::topk_ids(int layer, int64_t begin, int64_t end,
                                                std::vector<ExpertId>& scratch) const {
  const Impl& d = *impl_;
  COBALT_CHECK_ARG(d.has_topk, "{}: tensor topk_ids: absent (load-only trace)", d.context);
  COBALT_CHECK_ARG(layer >= 0 && layer < d.num_layers,
                   "{}: tensor topk_ids: layer {} out of range (valid range [0, {}))", d.context,
                   layer, d.num_layers);
  COBALT_CHECK_ARG(0 <= begin && begin <= end && end <= d.num_tokens,
                   "{}: tensor topk_ids: tokens [{}, {}) out of range (valid range [0, {}])",
                   d.context, begin, end, d.num_tokens);
  const size_t row_bytes = static_cast<size_t>(d.top_k) * dtype_size(d.topk_dtype);
  const size_t offset = (static_cast<size_t>(layer) * d.num_tokens + begin) * row_bytes;
  return view_ids(d.topk_bytes.subspan(offset, static_cast<size_t>(end - begin) * row_bytes),
                  d.topk_dtype, scratch);
}

std::span<const RankId> TraceReader::source_rank(int64_t begin, int64_t end,
                                                 std::vector<RankId>& scratch) const {
  const Impl& d = *impl_;
  COBALT_CHECK_ARG(d.has_source, "{}: tensor source_rank: absent", d.context);
  COBALT_CHECK_ARG(0 <= begin && begin <= end && end <= d.num_tokens,
                   "{}: tensor source_rank: tokens [{}, {}) out of range (valid range [0, {}])",
                   d.context, begin, end, d.num_tokens);
  return view_as<RankId>(d.source_bytes.subspan(static_cast<size_t>(begin) * sizeof(RankId),
                                                static_cast<size_t>(end - begin) * sizeof(RankId)),
                         scratch);
}

std::span<const int32_t> TraceReader::counts(int step, int layer,
                                             std::vector<int32_t>& scratch) const {
  const Impl& d = *impl_;
  COBALT_CHECK_ARG(d.has_counts, "{}: tensor counts: absent (not a load-only trace)", d.context);
  COBALT_CHECK_ARG(step >= 0 && step < num_steps(),
                   "{}: tensor counts: step {} out of range (valid range [0, {}))", d.context, step,
                   num_steps());
  COBALT_CHECK_ARG(layer >= 0 && layer < d.num_layers,
                   "{}: tensor counts: layer {} out of range (valid range [0, {}))", d.context,
                   layer, d.num_layers);
  const size_t block = static_cast<size_t>(d.num_sources) * d.num_experts;
  const size_t offset = (static_cast<size_t>(step) * d.num_layers + layer) * block;
  return view_as<int32_t>(d.counts_bytes.subspan(offset * sizeof(int32_t), block * sizeof(int32_t)),
                          scratch);
}

TraceData TraceReader::load() const {
  const Impl& d = *impl_;
  TraceData data;
  data.num_experts = d.num_experts;
  data.top_k = d.top_k;
  data.num_layers = d.num_layers;
  data.num_tokens = d.num_tokens;
  data.num_sources = d.num_sources;
  for (const auto& [key, value] : d.metadata) {
    if (!is_reserved(key)) data.metadata.emplace(key, value);
  }
  if (d.has_counts) {
    std::vector<int32_t> scratch;
    data.num_count_steps = num_steps();
    const auto all = view_as<int32_t>(d.counts_bytes, scratch);
    data.counts.assign(all.begin(), all.end());
    return data;
  }
  data.step_offsets = d.step_offsets;
  std::vector<ExpertId> scratch;
  const auto ids = view_ids(d.topk_bytes, d.topk_dtype, scratch);
  data.topk_ids.assign(ids.begin(), ids.end());
  if (d.has_source) {
    std::vector<RankId> rank_scratch;
    const auto ranks = view_as<RankId>(d.source_bytes, rank_scratch);
    data.source_rank.assign(ranks.begin(), ranks.end());
  }
  return data;
}

}  // namespace cobalt::io
