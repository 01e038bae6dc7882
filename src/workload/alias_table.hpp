// AliasTable (private to the generator): O(1) weighted sampling of items (Vose's alias method),
// plus sampling without replacement against a small set of already-chosen items.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::workload {

class AliasTable {
 public:
  AliasTable() = default;
  // items [n] with weights [n] (>= 0, finite). Deterministic: same inputs => same table.
  void build(std::span<const ExpertId> items, std::span<const double> weights);

  int size() const { return static_cast<int>(items_.size()); }
  std::span<const ExpertId> items() const { return items_; }

  std::span<const double> weights() const { return weights_; }  // [n], normalised to sum 1

  // One weighted draw from a 64-bit hash (the index and the coin come from its 53 high bits).
  ExpertId sample(uint64_t hash) const {
    const double x = uniform_unit(hash) * static_cast<double>(items_.size());
    size_t i = static_cast<size_t>(x);
    if (i >= items_.size()) i = items_.size() - 1;
    const double coin = x - static_cast<double>(i);
    return coin < accept_[i] ? items_[i] : items_[alias_[i]];
  }

  // A weighted draw among the items not in `chosen`: a few rejection draws from `next_hash()`, then
  // an exact scan. Returns -1 when every item with positive weight is already chosen.
  template <typename NextHash>
  ExpertId sample_excluding(std::span<const ExpertId> chosen, NextHash&& next_hash) const {
    if (items_.empty()) return -1;
    // Small tables: the exact scan is cheap, and many of their items may already be chosen.
    const int attempts = items_.size() <= kSmallTable ? 2 : kRejectionAttempts;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      const ExpertId e = sample(next_hash());
      if (!contains(chosen, e)) return e;
    }
    return scan_excluding(chosen, next_hash());
  }

  static bool contains(std::span<const ExpertId> chosen, ExpertId e) {
    for (ExpertId c : chosen) {
      if (c == e) return true;
    }
    return false;
  }

 private:
  static constexpr int kRejectionAttempts = 24;
  static constexpr size_t kSmallTable = 32;
  ExpertId scan_excluding(std::span<const ExpertId> chosen, uint64_t hash) const;

  std::vector<ExpertId> items_;  // [n]
  std::vector<double> weights_;  // [n] normalised to sum 1
  std::vector<double> accept_;   // [n] probability of keeping slot i's own item
  std::vector<int32_t> alias_;   // [n] index of the alternative item of slot i
};

}  // namespace cobalt::workload
