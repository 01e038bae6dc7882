#include "alias_table.hpp"

#include "cobalt/core/error.hpp"

namespace cobalt::workload {

void AliasTable::build(std::span<const ExpertId> items, std::span<const double> weights) {
  COBALT_CHECK_INTERNAL(items.size() == weights.size(), "alias table: {} items, {} weights",
                        items.size(), weights.size());
  const size_t n = items.size();
  items_.assign(items.begin(), items.end());
  weights_.assign(weights.begin(), weights.end());
  accept_.assign(n, 1.0);
  alias_.resize(n);
  double total = 0;
  for (double w : weights_) total += w;
  if (n == 0) return;
  if (!(total > 0)) {  // all zero: uniform
    for (auto& w : weights_) w = 1.0;
    total = static_cast<double>(n);
  }
  for (auto& w : weights_) w /= total;
  // Vose: scaled probabilities; small and large worklists processed in index order.
  std::vector<double> scaled(n);
  std::vector<int32_t> small, large;
  for (size_t i = 0; i < n; ++i) {
    scaled[i] = weights_[i] * static_cast<double>(n);
    alias_[i] = static_cast<int32_t>(i);
    (scaled[i] < 1.0 ? small : large).push_back(static_cast<int32_t>(i));
  }
  while (!small.empty() && !large.empty()) {
    const int32_t s = small.back();
    small.pop_back();
    const int32_t l = large.back();
    accept_[s] = scaled[s];
    alias_[s] = l;
    scaled[l] = (scaled[l] + scaled[s]) - 1.0;
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  for (int32_t i : small) accept_[i] = 1.0;  // rounding leftovers
  for (int32_t i : large) accept_[i] = 1.0;
}

ExpertId AliasTable::scan_excluding(std::span<const ExpertId> chosen, uint64_t hash) const {
  double remaining = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (!contains(chosen, items_[i])) remaining += weights_[i];
  }
  if (!(remaining > 0)) return -1;
  const double target = uniform_unit(hash) * remaining;
  double acc = 0;
  ExpertId last = -1;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (contains(chosen, items_[i]) || weights_[i] <= 0) continue;
    acc += weights_[i];
    last = items_[i];
    if (target < acc) return items_[i];
  }
  return last;  // rounding: the last eligible item
}

}  // namespace cobalt::workload
