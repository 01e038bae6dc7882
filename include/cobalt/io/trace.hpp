// cobalt-trace v1 (DESIGN.md §3.1): a safetensors file holding routing decisions.
//
//   __metadata__: format = "cobalt-trace", version = "1", num_experts, top_k; optional model, dataset,
//                 origin, num_sources, notes (any string map)
//   topk_ids      I32 | I16 [L, T, K]   expert ids, K distinct ids in [0, E) per row
//   step_offsets  I64 [S + 1]           0 = o_0 <= o_1 <= ... <= o_S = T (absent => one step)
//   source_rank   I32 [T]               optional, in [0, num_sources)
//   topk_weights  F32 | BF16 [L, T, K]  optional (kept opaque)
//   layer_ids     I32 [L], token_ids I32 [T]   optional
//   counts        I32 [S, L, R, E]      load-only traces (no topk_ids): tokens of source r choosing e
//
// TraceData is the owning in-memory form (what the generator makes and the writer takes). TraceReader
// memory-maps a file, validates it completely once, and serves zero-copy views per (layer, step), so a
// trace larger than memory can be replayed step by step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/ids.hpp"

namespace cobalt::io {

struct TraceData {
  int num_experts = 0;
  int top_k = 0;
  int num_layers = 0;
  int64_t num_tokens = 0;                 // T (0 for load-only traces)
  std::vector<ExpertId> topk_ids;         // [L, T, K]
  std::vector<int64_t> step_offsets;      // [S + 1]; empty => one step
  std::vector<RankId> source_rank;        // [T] or empty
  int num_sources = 0;                    // R when source_rank or counts is present
  std::vector<int32_t> counts;            // [S, L, R, E] for load-only traces, else empty
  int num_count_steps = 0;                // S of counts
  std::map<std::string, std::string> metadata;  // extra metadata (model, dataset, origin, notes...)
};

// Writes `data` as cobalt-trace v1 (topk_ids as I32). Validates first (same rules as the reader) and
// throws cobalt::Error(kInvalidArgument) naming the problem; writes via a temporary file + rename so a
// failed write never leaves a partial file behind.
void write_trace(const std::string& path, const TraceData& data);

class TraceReader {
 public:
  // Opens, maps and validates `path`. Throws cobalt::Error(kInvalidArgument) with a one-line message
  // "trace FILE: tensor NAME: problem" for any malformed input; never crashes on hostile bytes.
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;

  const std::string& path() const;
  int num_experts() const;
  int top_k() const;
  int num_layers() const;          // L (of topk_ids, or of counts)
  int64_t num_tokens() const;      // T (0 for load-only)
  int num_steps() const;           // S
  bool has_token_ids() const;      // false for load-only (counts) traces
  bool has_source_rank() const;
  int num_sources() const;         // R (metadata num_sources, else max source + 1; 0 when absent)
  std::span<const int64_t> step_offsets() const;  // [S + 1]
  const std::map<std::string, std::string>& metadata() const;

  // Expert ids of `layer`, tokens [begin, end): [(end - begin), K]. Zero-copy for aligned I32 data;
  // I16 (or misaligned) data is widened into `scratch`, which must outlive the returned span.
  std::span<const ExpertId> topk_ids(int layer, int64_t begin, int64_t end,
                                     std::vector<ExpertId>& scratch) const;
  // Source ranks of tokens [begin, end) (requires has_source_rank()).
  std::span<const RankId> source_rank(int64_t begin, int64_t end, std::vector<RankId>& scratch) const;
  // Load-only traces: counts of step s, layer l: [R, E].
  std::span<const int32_t> counts(int step, int layer, std::vector<int32_t>& scratch) const;
  bool has_counts() const;

  // Loads everything into memory (for small traces and tests).
  TraceData load() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cobalt::io
