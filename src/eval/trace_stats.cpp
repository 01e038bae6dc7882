#include "cobalt/eval/trace_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt::eval {

namespace {

// What the statistics read from a trace: implemented over a TraceReader (file) and a TraceData.
class TraceSource {
 public:
  virtual ~TraceSource() = default;
  virtual int num_experts() const = 0;
  virtual int top_k() const = 0;
  virtual int num_layers() const = 0;
  virtual int64_t num_tokens() const = 0;
  virtual int num_steps() const = 0;
  virtual int num_sources() const = 0;  // 0 when absent
  virtual bool load_only() const = 0;
  virtual bool has_source_rank() const = 0;
  // Token traces: first token of step s, s in [0, S].
  virtual int64_t step_offset(int step) const = 0;
  // Token traces: ids of `layer`, all tokens: [T, K].
  virtual std::span<const ExpertId> layer_ids(int layer, std::vector<ExpertId>& scratch) const = 0;
  // Token traces with source ranks: [T].
  virtual std::span<const RankId> sources(std::vector<RankId>& scratch) const = 0;
  // Load-only traces: counts of (step, layer): [R, E].
  virtual std::span<const int32_t> counts(int step, int layer,
                                          std::vector<int32_t>& scratch) const = 0;
};

class ReaderSource final : public TraceSource {
 public:
  explicit ReaderSource(const io::TraceReader& r) : r_(r) {}
  int num_experts() const override { return r_.num_experts(); }
  int top_k() const override { return r_.top_k(); }
  int num_layers() const override { return r_.num_layers(); }
  int64_t num_tokens() const override { return r_.num_tokens(); }
  int num_steps() const override { return r_.num_steps(); }
  int num_sources() const override { return r_.num_sources(); }
  bool load_only() const override { return !r_.has_token_ids(); }
  bool has_source_rank() const override { return r_.has_source_rank(); }
  int64_t step_offset(int step) const override {
    const auto offsets = r_.step_offsets();
    if (offsets.empty()) return step == 0 ? 0 : r_.num_tokens();
    return offsets[static_cast<size_t>(step)];
  }
  std::span<const ExpertId> layer_ids(int layer, std::vector<ExpertId>& scratch) const override {
    return r_.topk_ids(layer, 0, r_.num_tokens(), scratch);
  }
  std::span<const RankId> sources(std::vector<RankId>& scratch) const override {
    return r_.source_rank(0, r_.num_tokens(), scratch);
  }
  std::span<const int32_t> counts(int step, int layer,
                                  std::vector<int32_t>& scratch) const override {
    return r_.counts(step, layer, scratch);
  }

 private:
  const io::TraceReader& r_;
};

class DataSource final : public TraceSource {
 public:
  // Validates the data with the trace format's rules, so malformed data throws instead of crashing.
  explicit DataSource(const io::TraceData& d) : d_(d) {
    io::validate_trace_data(d, "trace stats");
    num_sources_ = d.num_sources;
    for (RankId r : d.source_rank) num_sources_ = std::max(num_sources_, r + 1);
  }
  int num_experts() const override { return d_.num_experts; }
  int top_k() const override { return d_.top_k; }
  int num_layers() const override { return d_.num_layers; }
  int64_t num_tokens() const override { return d_.num_tokens; }
  int num_steps() const override {
    if (load_only()) return d_.num_count_steps;
    return d_.step_offsets.empty() ? 1 : static_cast<int>(d_.step_offsets.size()) - 1;
  }
  int num_sources() const override { return num_sources_; }
  bool load_only() const override { return d_.topk_ids.empty() && !d_.counts.empty(); }
  bool has_source_rank() const override { return !d_.source_rank.empty(); }
  int64_t step_offset(int step) const override {
    if (d_.step_offsets.empty()) return step == 0 ? 0 : d_.num_tokens;
    return d_.step_offsets[static_cast<size_t>(step)];
  }
  std::span<const ExpertId> layer_ids(int layer, std::vector<ExpertId>&) const override {
    const size_t size = static_cast<size_t>(d_.num_tokens) * d_.top_k;
    return std::span<const ExpertId>(d_.topk_ids).subspan(layer * size, size);
  }
  std::span<const RankId> sources(std::vector<RankId>&) const override { return d_.source_rank; }
  std::span<const int32_t> counts(int step, int layer, std::vector<int32_t>&) const override {
    const size_t size = static_cast<size_t>(num_sources_) * d_.num_experts;
    return std::span<const int32_t>(d_.counts).subspan(
        (static_cast<size_t>(step) * d_.num_layers + layer) * size, size);
  }

 private:
  const io::TraceData& d_;
  int num_sources_ = 0;
};

double max_over_mean(std::span<const double> loads) {
  double total = 0, peak = 0;
  for (double w : loads) {
    total += w;
    peak = std::max(peak, w);
  }
  return total > 0 ? peak * static_cast<double>(loads.size()) / total : 1.0;
}

// Static EP (expert e on rank floor(e G / E)): max_r L_r / mean_r L_r of one step's loads [E].
double static_ep_imbalance(std::span<const double> loads, int num_ranks) {
  const int64_t num_experts = static_cast<int64_t>(loads.size());
  std::vector<double> rank_load(num_ranks, 0.0);
  for (int64_t e = 0; e < num_experts; ++e) rank_load[e * num_ranks / num_experts] += loads[e];
  return max_over_mean(rank_load);
}

// sum_r (n_r / n) * TV(p_r, p) over per-source counts [R, E]; nullopt without tasks.
std::optional<double> source_locality(std::span<const double> source_counts, int num_sources,
                                      int num_experts) {
  std::vector<double> total(num_experts, 0.0);
  double grand = 0;
  for (int r = 0; r < num_sources; ++r) {
    for (int e = 0; e < num_experts; ++e)
      total[e] += source_counts[static_cast<size_t>(r) * num_experts + e];
  }
  for (double w : total) grand += w;
  if (!(grand > 0)) return std::nullopt;
  double weighted = 0;
  for (int r = 0; r < num_sources; ++r) {
    const auto row = source_counts.subspan(static_cast<size_t>(r) * num_experts, num_experts);
    double n_r = 0;
    for (double w : row) n_r += w;
    if (!(n_r > 0)) continue;
    double tv = 0;
    for (int e = 0; e < num_experts; ++e) tv += std::abs(row[e] / n_r - total[e] / grand);
    weighted += (n_r / grand) * 0.5 * tv;
  }
  return weighted;
}

// Per-step statistics shared by token-level and load-only traces; step_loads: [non-empty steps][E].
void fill_step_stats(const std::vector<std::vector<double>>& step_loads, int hot_count,
                     int num_ranks, LayerTraceStats& out) {
  double skew_sum = 0, churn_sum = 0, static_sum = 0;
  for (size_t s = 0; s < step_loads.size(); ++s) {
    skew_sum += max_over_mean(step_loads[s]);
    if (num_ranks > 0) static_sum += static_ep_imbalance(step_loads[s], num_ranks);
    if (s > 0) churn_sum += hot_set_churn(step_loads[s - 1], step_loads[s], hot_count);
  }
  const double n = static_cast<double>(step_loads.size());
  out.load_max_mean_step = n > 0 ? skew_sum / n : 1.0;
  if (num_ranks > 0 && n > 0) out.static_ep_imbalance = static_sum / n;
  if (step_loads.size() >= 2) out.hot_set_churn = churn_sum / (n - 1);
}

LayerTraceStats token_layer_stats(const TraceSource& src, int layer, int num_ranks,
                                  const TraceStatsOptions& options,
                                  std::span<const RankId> sources) {
  const int num_experts = src.num_experts();
  const int top_k = src.top_k();
  const int64_t num_tokens = src.num_tokens();
  std::vector<ExpertId> scratch;
  const auto ids = src.layer_ids(layer, scratch);
  LayerTraceStats out;

  // Whole-layer loads and co-activation. The batch view needs [T] sources; their values are unused.
  std::vector<RankId> zero_sources;
  std::span<const RankId> batch_sources = sources;
  if (batch_sources.empty()) {
    zero_sources.assign(static_cast<size_t>(num_tokens), 0);
    batch_sources = zero_sources;
  }
  const auto batch = RoutingBatch::trusted(ids, batch_sources, top_k, num_experts, 1);
  std::vector<int64_t> counts(num_experts);
  std::vector<int64_t> coact(static_cast<size_t>(num_experts) * num_experts);
  count_routing(batch, counts, coact, options.num_threads);
  const std::vector<double> loads(counts.begin(), counts.end());
  const std::vector<double> coact_d(coact.begin(), coact.end());
  out.load_max_mean = max_over_mean(loads);
  const auto ochiai = summarize_ochiai(loads, coact_d);
  // Count-weighted Ochiai is 0/0 when no token chooses two experts (top-1, or no tokens): absent.
  if (std::any_of(coact.begin(), coact.end(), [](int64_t c) { return c > 0; })) {
    out.ochiai_count_weighted = ochiai.count_weighted;
  }
  out.ochiai_top_partner = ochiai.top_partner;

  // Per-step loads of non-empty steps.
  std::vector<std::vector<double>> step_loads;
  for (int s = 0; s < src.num_steps(); ++s) {
    const int64_t begin = src.step_offset(s), end = src.step_offset(s + 1);
    if (end <= begin) continue;
    std::vector<double> w(num_experts, 0.0);
    for (int64_t i = begin * top_k; i < end * top_k; ++i) w[ids[i]] += 1.0;
    step_loads.push_back(std::move(w));
  }
  fill_step_stats(step_loads, options.hot_count, num_ranks, out);

  if (!sources.empty()) {
    // Rows for the sources that have tokens only, in source order (a source without tokens adds
    // nothing to the locality), so the table grows with the trace, not with its declared sources.
    std::vector<int32_t> row_of(static_cast<size_t>(src.num_sources()), 0);
    for (int64_t t = 0; t < num_tokens; ++t) row_of[sources[t]] = 1;
    int num_rows = 0;
    for (int32_t& row : row_of) row = row != 0 ? num_rows++ : -1;
    std::vector<double> per_source(static_cast<size_t>(num_rows) * num_experts, 0.0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      double* row = per_source.data() + static_cast<size_t>(row_of[sources[t]]) * num_experts;
      for (int k = 0; k < top_k; ++k) row[ids[t * top_k + k]] += 1.0;
    }
    out.source_locality = source_locality(per_source, num_rows, num_experts);
  }
  return out;
}

LayerTraceStats count_layer_stats(const TraceSource& src, int layer, int num_ranks,
                                  const TraceStatsOptions& options) {
  const int num_experts = src.num_experts();
  const int num_sources = src.num_sources();
  std::vector<int32_t> scratch;
  std::vector<double> whole(num_experts, 0.0);
  std::vector<double> per_source(static_cast<size_t>(num_sources) * num_experts, 0.0);
  std::vector<std::vector<double>> step_loads;
  for (int s = 0; s < src.num_steps(); ++s) {
    const auto counts = src.counts(s, layer, scratch);  // [R, E]
    std::vector<double> w(num_experts, 0.0);
    double total = 0;
    for (int r = 0; r < num_sources; ++r) {
      for (int e = 0; e < num_experts; ++e) {
        const double c = counts[static_cast<size_t>(r) * num_experts + e];
        w[e] += c;
        per_source[static_cast<size_t>(r) * num_experts + e] += c;
        total += c;
      }
    }
    for (int e = 0; e < num_experts; ++e) whole[e] += w[e];
    if (total > 0) step_loads.push_back(std::move(w));
  }
  LayerTraceStats out;
  out.load_max_mean = max_over_mean(whole);
  fill_step_stats(step_loads, options.hot_count, num_ranks, out);
  out.source_locality = source_locality(per_source, num_sources, num_experts);
  return out;
}

// Mean of the present values; nullopt when none is present.
std::optional<double> mean_present(const std::vector<LayerTraceStats>& layers,
                                   std::optional<double> LayerTraceStats::*field) {
  double sum = 0;
  int n = 0;
  for (const auto& l : layers) {
    if (const auto& v = l.*field) {
      sum += *v;
      ++n;
    }
  }
  return n > 0 ? std::optional<double>(sum / n) : std::nullopt;
}

TraceStats compute(const TraceSource& src, const TraceStatsOptions& options) {
  COBALT_CHECK_ARG(options.hot_count >= 1, "trace stats: hot_count = {} must be >= 1",
                   options.hot_count);
  COBALT_CHECK_ARG(options.num_ranks >= 0 && options.num_ranks <= 65536,
                   "trace stats: num_ranks = {} out of range [0, 65536] (0 = the trace's sources)",
                   options.num_ranks);
  TraceStats stats;
  stats.num_experts = src.num_experts();
  stats.top_k = src.top_k();
  stats.num_layers = src.num_layers();
  stats.num_tokens = src.num_tokens();
  stats.num_steps = src.num_steps();
  stats.load_only = src.load_only();
  stats.num_sources = (stats.load_only || src.has_source_rank()) ? src.num_sources() : 0;
  stats.hot_count = std::min(options.hot_count, stats.num_experts);  // capped at E
  stats.static_ep_ranks = options.num_ranks > 0 ? options.num_ranks : stats.num_sources;

  // The largest tables: E x E co-activation (int64 counts and their double copy) and per-source
  // loads, R x E for load-only traces, a row per source with tokens (at most T) otherwise.
  const double num_experts = stats.num_experts;
  const double source_rows =
      stats.load_only ? stats.num_sources
                      : std::min<double>(stats.num_sources, static_cast<double>(stats.num_tokens));
  require_memory(16.0 * num_experts * num_experts + 8.0 * source_rows * num_experts,
                 fmt::format("trace statistics for E = {} experts and {} sources",
                             stats.num_experts, stats.num_sources));
  std::vector<RankId> source_scratch;
  std::span<const RankId> sources;
  if (!stats.load_only && src.has_source_rank()) sources = src.sources(source_scratch);

  for (int layer = 0; layer < stats.num_layers; ++layer) {
    stats.layers.push_back(
        stats.load_only ? count_layer_stats(src, layer, stats.static_ep_ranks, options)
                        : token_layer_stats(src, layer, stats.static_ep_ranks, options, sources));
    if (options.progress) options.progress(layer + 1, stats.num_layers);
  }
  double skew = 0, skew_step = 0;
  for (const auto& l : stats.layers) {
    skew += l.load_max_mean;
    skew_step += l.load_max_mean_step;
  }
  if (!stats.layers.empty()) {
    stats.load_max_mean = skew / static_cast<double>(stats.layers.size());
    stats.load_max_mean_step = skew_step / static_cast<double>(stats.layers.size());
  }
  stats.ochiai_count_weighted = mean_present(stats.layers, &LayerTraceStats::ochiai_count_weighted);
  stats.ochiai_top_partner = mean_present(stats.layers, &LayerTraceStats::ochiai_top_partner);
  stats.hot_set_churn = mean_present(stats.layers, &LayerTraceStats::hot_set_churn);
  stats.static_ep_imbalance = mean_present(stats.layers, &LayerTraceStats::static_ep_imbalance);
  stats.source_locality = mean_present(stats.layers, &LayerTraceStats::source_locality);
  return stats;
}

}  // namespace

TraceStats compute_trace_stats(const io::TraceReader& trace, const TraceStatsOptions& options) {
  return compute(ReaderSource(trace), options);
}

TraceStats compute_trace_stats(const io::TraceData& trace, const TraceStatsOptions& options) {
  return compute(DataSource(trace), options);
}

}  // namespace cobalt::eval
