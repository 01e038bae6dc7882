#include "cobalt/eval/step_source.hpp"

#include "cobalt/core/error.hpp"

namespace cobalt::eval {

void map_sources(std::span<const RankId> raw, int num_sources, int num_ranks,
                 std::span<RankId> out) {
  for (size_t i = 0; i < raw.size(); ++i) {
    out[i] = static_cast<RankId>(static_cast<int64_t>(raw[i]) * num_ranks / num_sources);
  }
}

namespace {

std::span<const RankId> mapped_sources(std::span<const RankId> raw, int num_sources,
                                       int64_t num_tokens, int num_ranks, StepScratch& scratch) {
  scratch.src.resize(num_tokens);
  if (raw.empty()) {
    contiguous_source_ranks(num_tokens, num_ranks, scratch.src);
  } else {
    map_sources(raw, num_sources, num_ranks, scratch.src);
  }
  return scratch.src;
}

class ReaderSource final : public StepSource {
 public:
  explicit ReaderSource(const io::TraceReader& reader) : reader_(reader) {
    COBALT_CHECK_ARG(
        reader.has_token_ids(),
        "trace {}: load-only trace (counts): token-level replay needs per-token topk_ids",
        reader.path());
  }
  int num_experts() const override { return reader_.num_experts(); }
  int top_k() const override { return reader_.top_k(); }
  int num_layers() const override { return reader_.num_layers(); }
  int num_steps() const override { return reader_.num_steps(); }
  int64_t num_tokens(int step) const override {
    return reader_.step_offsets()[step + 1] - reader_.step_offsets()[step];
  }
  RoutingBatch batch(int step, int layer, int num_ranks, StepScratch& scratch) const override {
    const int64_t begin = reader_.step_offsets()[step], end = reader_.step_offsets()[step + 1];
    auto ids = reader_.topk_ids(layer, begin, end, scratch.ids);
    std::span<const RankId> raw;
    if (reader_.has_source_rank()) raw = reader_.source_rank(begin, end, scratch.raw_src);
    auto src = mapped_sources(raw, reader_.num_sources(), end - begin, num_ranks, scratch);
    return RoutingBatch::trusted(ids, src, top_k(), num_experts(), num_ranks);
  }

 private:
  const io::TraceReader& reader_;
};

class DataSource final : public StepSource {
 public:
  explicit DataSource(const io::TraceData& data) : data_(data) {
    COBALT_CHECK_ARG(
        !data.topk_ids.empty(),
        "trace: load-only trace (counts): token-level replay needs per-token topk_ids");
    if (data_.step_offsets.empty())
      offsets_ = {0, data_.num_tokens};
    else
      offsets_ = data_.step_offsets;
  }
  int num_experts() const override { return data_.num_experts; }
  int top_k() const override { return data_.top_k; }
  int num_layers() const override { return data_.num_layers; }
  int num_steps() const override { return static_cast<int>(offsets_.size()) - 1; }
  int64_t num_tokens(int step) const override { return offsets_[step + 1] - offsets_[step]; }
  RoutingBatch batch(int step, int layer, int num_ranks, StepScratch& scratch) const override {
    const int64_t begin = offsets_[step], end = offsets_[step + 1];
    const size_t row = static_cast<size_t>(data_.num_tokens) * data_.top_k;
    std::span<const ExpertId> ids(data_.topk_ids.data() + layer * row + begin * data_.top_k,
                                  static_cast<size_t>(end - begin) * data_.top_k);
    std::span<const RankId> raw;
    if (!data_.source_rank.empty()) {
      raw = std::span<const RankId>(data_.source_rank.data() + begin,
                                    static_cast<size_t>(end - begin));
    }
    auto src = mapped_sources(raw, data_.num_sources, end - begin, num_ranks, scratch);
    return RoutingBatch::trusted(ids, src, top_k(), num_experts(), num_ranks);
  }

 private:
  const io::TraceData& data_;
  std::vector<int64_t> offsets_;
};

}  // namespace

std::unique_ptr<StepSource> make_step_source(const io::TraceReader& reader) {
  return std::make_unique<ReaderSource>(reader);
}
std::unique_ptr<StepSource> make_step_source(const io::TraceData& data) {
  return std::make_unique<DataSource>(data);
}

}  // namespace cobalt::eval
