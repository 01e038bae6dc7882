// cobalt-trace v1 (DESIGN.md §3.1): a safetensors file holding routing decisions.
//
//   __metadata__: format = "cobalt-trace", version = "1", num_experts, top_k; optional model,
//                 dataset, origin, num_sources, notes (any string map)
//   topk_ids      I32 | I16 [L, T, K]   expert ids, K distinct ids in [0, E) per row
//   step_offsets  I64 [S + 1]           0 = o_0 <= o_1 <= ... <= o_S = T (absent => one step)
//   source_rank   I32 [T]               optional, in [0, num_sources)
//   topk_weights  F32 | BF16 [L, T, K]  optional (kept opaque)
//   layer_ids     I32 [L], token_ids I32 [T]   optional
//   counts        I32 [S, L, R, E]      load-only traces (no topk_ids): tokens of source r
//                                       choosing expert e
//
// TraceData is the owning in-memory form (what the generator makes and the writer takes).
// TraceReader memory-maps a file, validates it completely once, and serves zero-copy views per
// (layer, step), so a trace larger than memory can be replayed step by step. Beyond the format
// rules the reader requires L >= 1 and, for token traces, T >= 1; it rejects unknown tensor names
// and a trace holding both topk_ids and counts. The file must not be truncated while a reader maps
// it (that raises SIGBUS).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/core/ids.hpp"

namespace cobalt::io {

struct TraceData {
  int num_experts = 0;
  int top_k = 0;
  int num_layers = 0;
  int64_t num_tokens = 0;                       // T (0 for load-only traces)
  std::vector<ExpertId> topk_ids;               // [L, T, K]
  std::vector<int64_t> step_offsets;            // [S + 1]; empty => one step
  std::vector<RankId> source_rank;              // [T] or empty
  int num_sources = 0;                          // R when source_rank or counts is present
  std::vector<int32_t> counts;                  // [S, L, R, E] for load-only traces, else empty
  int num_count_steps = 0;                      // S of counts
  std::map<std::string, std::string> metadata;  // extra metadata (model, dataset, origin, notes...)
};

// Checks `data` against the cobalt-trace v1 rules (the reader's): E >= 1, 1 <= K <= E, L >= 1;
// either a token trace (T >= 1, topk_ids [L*T*K] rows of distinct ids in [0, E), step_offsets empty
// or 0 = o_0 <= ... <= o_S = T, source_rank empty or [T] in [0, num_sources) (any non-negative
// value when num_sources is 0)) or a load-only trace (counts [S*L*R*E] >= 0 with S, R >= 1, no ids,
// offsets or source ranks, T = 0). metadata must not set num_experts, top_k or num_sources, and may
// set format and version only to their fixed values. Throws kInvalidArgument "CONTEXT: tensor NAME:
// problem".
void validate_trace_data(const TraceData& data, std::string_view context);
// The same with `metadata` in place of data.metadata.
void validate_trace_data(const TraceData& data, const std::map<std::string, std::string>& metadata,
                         std::string_view context);

// Writes `data` as cobalt-trace v1 (topk_ids as I32). Validates first (same rules as the reader)
// and throws cobalt::Error(kInvalidArgument) naming the problem; writes via a temporary file +
// rename so a failed write never leaves a partial file behind. Always writes step_offsets ([0, T]
// when empty) and, when positive (or derivable as max source_rank + 1), metadata num_sources.
void write_trace(const std::string& path, const TraceData& data);
// The same with `metadata` in place of data.metadata, for a caller that holds its own copy of the
// map (the Python bindings copy it before they release the GIL: Python may replace the field
// meanwhile).
void write_trace(const std::string& path, const TraceData& data,
                 const std::map<std::string, std::string>& metadata);

class TraceReader {
 public:
  // Opens, maps and validates `path`. Throws cobalt::Error(kInvalidArgument) with a one-line
  // message "trace FILE: tensor NAME: problem" for any malformed input; never crashes on hostile
  // bytes. The accessors below throw kInvalidArgument for out-of-range layer/token/step arguments.
  // A moved-from reader may only be destroyed or assigned to.
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;

  const std::string& path() const;
  int num_experts() const;
  int top_k() const;
  int num_layers() const;      // L (of topk_ids, or of counts)
  int64_t num_tokens() const;  // T (0 for load-only)
  int num_steps() const;       // S
  bool has_token_ids() const;  // false for load-only (counts) traces
  bool has_source_rank() const;
  int num_sources() const;  // R (metadata num_sources, else max source + 1; 0 when absent)
  std::span<const int64_t> step_offsets() const;               // [S + 1]
  const std::map<std::string, std::string>& metadata() const;  // the whole __metadata__ map

  // Expert ids of `layer`, tokens [begin, end): [(end - begin), K]. Zero-copy for aligned I32 data;
  // I16 (or misaligned) data is widened into `scratch`, which must outlive the returned span.
  std::span<const ExpertId> topk_ids(int layer, int64_t begin, int64_t end,
                                     std::vector<ExpertId>& scratch) const;
  // Source ranks of tokens [begin, end) (requires has_source_rank()).
  std::span<const RankId> source_rank(int64_t begin, int64_t end,
                                      std::vector<RankId>& scratch) const;
  // Load-only traces: counts of step s, layer l: [R, E].
  std::span<const int32_t> counts(int step, int layer, std::vector<int32_t>& scratch) const;
  bool has_counts() const;

  // Loads everything into memory (for small traces and tests). step_offsets is always filled
  // ([S + 1]); metadata holds only the extra keys (not format, version, num_experts, top_k,
  // num_sources); topk_weights, layer_ids and token_ids are not loaded.
  TraceData load() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cobalt::io
