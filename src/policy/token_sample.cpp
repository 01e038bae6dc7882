#include "token_sample.hpp"

#include <algorithm>

namespace cobalt::policy::detail {

void TokenSample::append_strided(const RoutingBatch& batch, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i * batch.num_tokens() / n;
    auto row = batch.experts_of(t);
    ids_.insert(ids_.end(), row.begin(), row.end());
    sources_.push_back(batch.source_of(t));
  }
}

void TokenSample::record(const RoutingBatch& batch) {
  const int64_t n = std::min(kTokensPerStep, batch.num_tokens());
  if (step_sizes_.size() == kSteps) {
    const int64_t drop = step_sizes_.front();
    step_sizes_.erase(step_sizes_.begin());
    step_tokens_.erase(step_tokens_.begin());
    ids_.erase(ids_.begin(), ids_.begin() + drop * batch.top_k());
    sources_.erase(sources_.begin(), sources_.begin() + drop);
  }
  step_sizes_.push_back(n);
  step_tokens_.push_back(batch.num_tokens());
  append_strided(batch, n);
}

void TokenSample::fold(const RoutingBatch& batch) {
  if (step_sizes_.empty()) return record(batch);
  const int64_t before = step_tokens_.back();
  const int64_t total = before + batch.num_tokens();
  if (total == 0) return;
  const int64_t n = std::min(kTokensPerStep, total);
  const int64_t keep = n * before / total;  // of the step's sample so far; n - keep <= batch's
  const int64_t old_n = step_sizes_.back();
  const size_t old_begin = sources_.size() - static_cast<size_t>(old_n);
  const size_t top_k = static_cast<size_t>(batch.top_k());
  std::vector<ExpertId> kept_ids;
  std::vector<RankId> kept_sources;
  for (int64_t i = 0; i < keep; ++i) {
    const size_t j = old_begin + static_cast<size_t>(i * old_n / keep);
    kept_ids.insert(kept_ids.end(), ids_.begin() + j * top_k, ids_.begin() + (j + 1) * top_k);
    kept_sources.push_back(sources_[j]);
  }
  ids_.resize(old_begin * top_k);
  sources_.resize(old_begin);
  ids_.insert(ids_.end(), kept_ids.begin(), kept_ids.end());
  sources_.insert(sources_.end(), kept_sources.begin(), kept_sources.end());
  step_sizes_.back() = n;
  step_tokens_.back() = total;
  append_strided(batch, n - keep);
}

double TokenSample::step_scale() const {
  int64_t sampled = 0, whole = 0;
  for (size_t i = 0; i < step_sizes_.size(); ++i) {
    sampled += step_sizes_[i];
    whole += step_tokens_[i];
  }
  if (sampled == 0) return 1.0;
  return static_cast<double>(whole) / static_cast<double>(step_sizes_.size()) /
         static_cast<double>(sampled);
}

}  // namespace cobalt::policy::detail
