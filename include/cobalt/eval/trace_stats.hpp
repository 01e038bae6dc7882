// Summary statistics of a routing trace (what `cobalt trace info` prints), with the definitions of
// DESIGN.md §3.3:
//   load max/mean      max_e w_e / mean_e w_e of expert task counts w [E]
//   Ochiai summaries   count-weighted and top-partner (stats/routing_stats.hpp summarize_ochiai)
//   hot-set churn      fraction of the H most loaded experts of step s not among those of step s+1
//   static-EP imbalance   max_r L_r / mean_r L_r with expert e on rank floor(e G / E) (no
//   balancing) source locality    sum_r (n_r / n) TV(p_r, p), the token-weighted total-variation
//   distance between
//                      each source rank's expert distribution p_r and the layer's p (0 = no
//                      locality)
// Trace-level values average the per-layer values over layers. Values that a trace cannot support
// are absent (std::nullopt): Ochiai for load-only traces (and count-weighted Ochiai where no token
// chooses two experts: 0/0), churn with fewer than two non-empty
// steps, source locality without source ranks, static-EP imbalance without a rank count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "cobalt/io/trace.hpp"

namespace cobalt::eval {

struct TraceStatsOptions {
  int hot_count = 8;  // H of the hot-set churn, >= 1; capped at E (TraceStats::hot_count is used)
  int num_ranks = 0;  // G of the static-EP imbalance; 0 => the trace's num_sources (absent if none)
  int num_threads = 1;  // for the co-activation counts; results do not depend on it
  // Called after each layer with (layers done, layers): a layer costs O(T K^2 + E^2), so a trace
  // of many layers and experts takes a while whatever its token count. Optional.
  std::function<void(int, int)> progress;
};

struct LayerTraceStats {
  double load_max_mean = 0;                     // over the whole trace
  double load_max_mean_step = 0;                // per step, mean over non-empty steps
  std::optional<double> ochiai_count_weighted;  // over the whole trace (token-level traces)
  std::optional<double> ochiai_top_partner;
  std::optional<double> hot_set_churn;        // mean over adjacent non-empty step pairs
  std::optional<double> static_ep_imbalance;  // mean over non-empty steps
  std::optional<double> source_locality;      // over the whole trace
};

struct TraceStats {
  int num_experts = 0;     // E
  int top_k = 0;           // K
  int num_layers = 0;      // L
  int64_t num_tokens = 0;  // T (0 for load-only traces)
  int num_steps = 0;       // S
  int num_sources = 0;     // R (0 when the trace has no source ranks)
  bool load_only = false;
  int hot_count = 8;
  int static_ep_ranks = 0;  // G used for static_ep_imbalance (0 when absent)
  // Means over layers of the per-layer values (absent when absent in every layer).
  double load_max_mean = 0;
  double load_max_mean_step = 0;
  std::optional<double> ochiai_count_weighted;
  std::optional<double> ochiai_top_partner;
  std::optional<double> hot_set_churn;
  std::optional<double> static_ep_imbalance;
  std::optional<double> source_locality;
  std::vector<LayerTraceStats> layers;  // [L]
};

// Statistics of a trace file, one layer at a time: memory O(E^2 + S E + R E) plus one layer's
// rows, O(T) (a [T] zero source table when the trace has no source ranks, and a [T, K] int32 copy
// of the layer's ids when they are stored as I16). Throws cobalt::Error(kInvalidArgument) for bad
// options.
TraceStats compute_trace_stats(const io::TraceReader& trace, const TraceStatsOptions& options = {});

// The same statistics of an in-memory trace (e.g. straight from the workload generator).
TraceStats compute_trace_stats(const io::TraceData& trace, const TraceStatsOptions& options = {});

}  // namespace cobalt::eval
