#include "cobalt/eval/step_source.hpp"

#include <algorithm>

#include "cobalt/core/error.hpp"

namespace cobalt::eval {

void map_sources(std::span<const RankId> raw, int num_sources, int num_ranks,
                 std::span<RankId> out) {
  for (size_t i = 0; i < raw.size(); ++i) {
    out[i] = static_cast<RankId>(static_cast<int64_t>(raw[i]) * num_ranks / num_sources);
  }
}

void StepSource::loads(int, int, int, std::span<int64_t>, StepScratch&) const {
  fail(ErrorCode::kFailedPrecondition,
       "step source: per-rank expert loads are only served by load-only (counts) traces");
}

namespace {

// Token-level trace storage: contiguous token ranges within [0, T).
class TokenStore {
 public:
  virtual ~TokenStore() = default;
  int num_experts = 0, top_k = 0, num_layers = 0, num_sources = 0;
  int64_t num_tokens = 0;
  bool has_sources = false;
  std::vector<int64_t> offsets;  // [S + 1] the trace's own steps
  // [(end - begin), K]; may view `scratch`.
  virtual std::span<const ExpertId> ids(int layer, int64_t begin, int64_t end,
                                        std::vector<ExpertId>& scratch) const = 0;
  // [end - begin] raw source ranks (requires has_sources); may view `scratch`.
  virtual std::span<const RankId> sources(int64_t begin, int64_t end,
                                          std::vector<RankId>& scratch) const = 0;
};

class ReaderStore final : public TokenStore {
 public:
  explicit ReaderStore(const io::TraceReader& reader) : reader_(reader) {
    num_experts = reader.num_experts();
    top_k = reader.top_k();
    num_layers = reader.num_layers();
    num_tokens = reader.num_tokens();
    has_sources = reader.has_source_rank();
    num_sources = reader.num_sources();
    offsets.assign(reader.step_offsets().begin(), reader.step_offsets().end());
  }
  std::span<const ExpertId> ids(int layer, int64_t begin, int64_t end,
                                std::vector<ExpertId>& scratch) const override {
    return reader_.topk_ids(layer, begin, end, scratch);
  }
  std::span<const RankId> sources(int64_t begin, int64_t end,
                                  std::vector<RankId>& scratch) const override {
    return reader_.source_rank(begin, end, scratch);
  }

 private:
  const io::TraceReader& reader_;
};

class DataStore final : public TokenStore {
 public:
  explicit DataStore(const io::TraceData& data) : data_(data) {
    num_experts = data.num_experts;
    top_k = data.top_k;
    num_layers = data.num_layers;
    num_tokens = data.num_tokens;
    has_sources = !data.source_rank.empty();
    num_sources = data.num_sources;
    if (has_sources && num_sources <= 0) {
      num_sources = 1 + *std::max_element(data.source_rank.begin(), data.source_rank.end());
    }
    offsets =
        data.step_offsets.empty() ? std::vector<int64_t>{0, data.num_tokens} : data.step_offsets;
  }
  std::span<const ExpertId> ids(int layer, int64_t begin, int64_t end,
                                std::vector<ExpertId>&) const override {
    const size_t row = static_cast<size_t>(data_.num_tokens) * data_.top_k;
    return {data_.topk_ids.data() + layer * row + begin * data_.top_k,
            static_cast<size_t>(end - begin) * data_.top_k};
  }
  std::span<const RankId> sources(int64_t begin, int64_t end, std::vector<RankId>&) const override {
    return {data_.source_rank.data() + begin, static_cast<size_t>(end - begin)};
  }

 private:
  const io::TraceData& data_;
};

// Step boundaries in "extended" token coordinates (token i is trace token i mod T).
struct StepPlan {
  std::vector<int64_t> begin, end;  // [S]
  ChunkInfo info;
};

StepPlan plan_steps(const TokenStore& store, const ChunkOptions& chunks) {
  const int64_t total = store.num_tokens;
  StepPlan plan;
  plan.info.trace_steps = static_cast<int>(store.offsets.size()) - 1;
  plan.info.trace_tokens = total;
  COBALT_CHECK_ARG(!chunks.num_steps || *chunks.num_steps >= 1, "steps {} must be >= 1",
                   chunks.num_steps.value_or(0));
  // A replayed step is materialised per layer: 2^28 tokens (10^7 is the largest target) bounds it.
  COBALT_CHECK_ARG(!chunks.tokens_per_step || (*chunks.tokens_per_step >= 1 &&
                                               *chunks.tokens_per_step <= (int64_t{1} << 28)),
                   "tokens per step {} out of range [1, 2^28]", chunks.tokens_per_step.value_or(0));
  if (!chunks.num_steps && !chunks.tokens_per_step) {
    for (size_t s = 0; s + 1 < store.offsets.size(); ++s) {
      plan.begin.push_back(store.offsets[s]);
      plan.end.push_back(store.offsets[s + 1]);
    }
    return plan;
  }
  if (!chunks.tokens_per_step) {
    const int num_steps = *chunks.num_steps;
    COBALT_CHECK_ARG(num_steps <= total,
                     "cannot re-chunk a trace of {} tokens into {} steps (at most one step per "
                     "token; give --tokens-per-step too to cycle)",
                     total, num_steps);
    for (int s = 0; s < num_steps; ++s) {
      plan.begin.push_back(total * s / num_steps);
      plan.end.push_back(total * (s + 1) / num_steps);
    }
    plan.info.mode = "rechunked";
    return plan;
  }
  const int64_t per_step = *chunks.tokens_per_step;
  const int64_t num_steps =
      chunks.num_steps ? *chunks.num_steps : std::max<int64_t>(1, total / per_step);
  COBALT_CHECK_ARG(num_steps <= (int64_t{1} << 30), "too many steps: {} (at most 2^30)", num_steps);
  for (int64_t s = 0; s < num_steps; ++s) {
    plan.begin.push_back(s * per_step);
    plan.end.push_back((s + 1) * per_step);
  }
  const int64_t replayed = num_steps * per_step;
  plan.info.mode = replayed > total ? "cycled" : "rechunked";
  plan.info.passes = static_cast<double>(replayed) / static_cast<double>(total);
  return plan;
}

class TokenSource final : public StepSource {
 public:
  TokenSource(std::unique_ptr<TokenStore> store, const ChunkOptions& chunks)
      : store_(std::move(store)), plan_(plan_steps(*store_, chunks)) {}

  int num_experts() const override { return store_->num_experts; }
  int top_k() const override { return store_->top_k; }
  int num_layers() const override { return store_->num_layers; }
  int num_steps() const override { return static_cast<int>(plan_.begin.size()); }
  const ChunkInfo& chunk_info() const override { return plan_.info; }
  int64_t num_tokens(int step) const override { return plan_.end[step] - plan_.begin[step]; }

  RoutingBatch batch(int step, int layer, int num_ranks, StepScratch& scratch) const override {
    COBALT_CHECK_ARG(step >= 0 && step < num_steps() && layer >= 0 && layer < num_layers(),
                     "step source: (step {}, layer {}) out of range ({} steps, {} layers)", step,
                     layer, num_steps(), num_layers());
    const int64_t begin = plan_.begin[step], end = plan_.end[step], total = store_->num_tokens;
    const int64_t count = end - begin;
    const bool one_piece = begin / total == (end - 1) / total || count == 0;
    std::span<const ExpertId> ids;
    std::span<const RankId> raw;
    if (one_piece) {
      const int64_t offset = begin - begin % total;
      ids = store_->ids(layer, begin - offset, end - offset, scratch.ids);
      if (store_->has_sources) raw = store_->sources(begin - offset, end - offset, scratch.raw_src);
    } else {
      // The step wraps around the end of the trace: concatenate its pieces.
      scratch.ids.clear();
      scratch.raw_src.clear();
      for (int64_t pos = begin; pos < end;) {
        const int64_t at = pos % total, len = std::min(end - pos, total - at);
        auto piece = store_->ids(layer, at, at + len, scratch.piece);
        scratch.ids.insert(scratch.ids.end(), piece.begin(), piece.end());
        if (store_->has_sources) {
          auto src = store_->sources(at, at + len, scratch.raw_piece);
          scratch.raw_src.insert(scratch.raw_src.end(), src.begin(), src.end());
        }
        pos += len;
      }
      ids = scratch.ids;
      if (store_->has_sources) raw = scratch.raw_src;
    }
    scratch.src.resize(count);
    if (store_->has_sources) {
      map_sources(raw, store_->num_sources, num_ranks, scratch.src);
    } else {
      contiguous_source_ranks(count, num_ranks, scratch.src);
    }
    return RoutingBatch::trusted(ids, scratch.src, top_k(), num_experts(), num_ranks);
  }

 private:
  std::unique_ptr<TokenStore> store_;
  StepPlan plan_;
};

// Load-only traces: counts [S, L, R, E].
class CountsSource final : public StepSource {
 public:
  CountsSource(const io::TraceReader* reader, const io::TraceData* data, const ChunkOptions& chunks)
      : reader_(reader), data_(data) {
    COBALT_CHECK_ARG(!chunks.tokens_per_step,
                     "a load-only trace (counts) has no tokens to re-chunk: --tokens-per-step "
                     "does not apply (--steps N cycles its steps)");
    if (reader) {
      num_experts_ = reader->num_experts();
      top_k_ = reader->top_k();
      num_layers_ = reader->num_layers();
      trace_steps_ = reader->num_steps();
      num_sources_ = reader->num_sources();
    } else {
      num_experts_ = data->num_experts;
      top_k_ = data->top_k;
      num_layers_ = data->num_layers;
      trace_steps_ = data->num_count_steps;
      num_sources_ = data->num_sources;
    }
    COBALT_CHECK_ARG(!chunks.num_steps || *chunks.num_steps >= 1, "steps {} must be >= 1",
                     chunks.num_steps.value_or(0));
    num_steps_ = chunks.num_steps.value_or(trace_steps_);
    info_.trace_steps = trace_steps_;
    info_.trace_tokens = 0;
    if (num_steps_ != trace_steps_) {
      info_.mode = num_steps_ > trace_steps_ ? "cycled" : "rechunked";
      info_.passes = static_cast<double>(num_steps_) / trace_steps_;
    }
  }

  int num_experts() const override { return num_experts_; }
  int top_k() const override { return top_k_; }
  int num_layers() const override { return num_layers_; }
  int num_steps() const override { return num_steps_; }
  const ChunkInfo& chunk_info() const override { return info_; }
  bool has_tokens() const override { return false; }
  int64_t num_tokens(int) const override { return 0; }

  RoutingBatch batch(int, int, int, StepScratch&) const override {
    fail(ErrorCode::kFailedPrecondition,
         "load-only trace (counts): token-level replay needs per-token topk_ids");
  }

  void loads(int step, int layer, int num_ranks, std::span<int64_t> out,
             StepScratch& scratch) const override {
    COBALT_CHECK_ARG(step >= 0 && step < num_steps_ && layer >= 0 && layer < num_layers_,
                     "step source: (step {}, layer {}) out of range ({} steps, {} layers)", step,
                     layer, num_steps_, num_layers_);
    COBALT_CHECK_ARG(out.size() == static_cast<size_t>(num_ranks) * num_experts_,
                     "step source: loads output of {} entries, want {} x {}", out.size(), num_ranks,
                     num_experts_);
    const int trace_step = step % trace_steps_;
    std::span<const int32_t> counts;  // [R, E]
    if (reader_) {
      counts = reader_->counts(trace_step, layer, scratch.counts);
    } else {
      const size_t block = static_cast<size_t>(num_sources_) * num_experts_;
      counts = {
          data_->counts.data() + (static_cast<size_t>(trace_step) * num_layers_ + layer) * block,
          block};
    }
    std::fill(out.begin(), out.end(), 0);
    for (int r = 0; r < num_sources_; ++r) {
      const int64_t rank = static_cast<int64_t>(r) * num_ranks / num_sources_;
      for (int e = 0; e < num_experts_; ++e) {
        out[rank * num_experts_ + e] += counts[static_cast<size_t>(r) * num_experts_ + e];
      }
    }
  }

 private:
  const io::TraceReader* reader_;
  const io::TraceData* data_;
  int num_experts_ = 0, top_k_ = 0, num_layers_ = 0, trace_steps_ = 0, num_sources_ = 0;
  int num_steps_ = 0;
  ChunkInfo info_;
};

}  // namespace

std::unique_ptr<StepSource> make_step_source(const io::TraceReader& reader,
                                             const ChunkOptions& chunks) {
  if (!reader.has_token_ids()) return std::make_unique<CountsSource>(&reader, nullptr, chunks);
  return std::make_unique<TokenSource>(std::make_unique<ReaderStore>(reader), chunks);
}

std::unique_ptr<StepSource> make_step_source(const io::TraceData& data,
                                             const ChunkOptions& chunks) {
  io::validate_trace_data(data, "step source");  // malformed data throws instead of crashing
  if (data.topk_ids.empty() && !data.counts.empty()) {
    return std::make_unique<CountsSource>(nullptr, &data, chunks);
  }
  COBALT_CHECK_ARG(!data.topk_ids.empty(), "trace: no topk_ids and no counts");
  return std::make_unique<TokenSource>(std::make_unique<DataStore>(data), chunks);
}

}  // namespace cobalt::eval
