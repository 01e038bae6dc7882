// Internal: items taken in increasing order of a costly value, measuring as few as the order
// needs, given a cheap lower bound of each (stage 2b's groups, floor_swaps.cpp: a candidate's
// shortfall left costs a max flow, its bound none).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace cobalt::plan::detail {

// next() returns the items in increasing (value, index) order, each once, leaving out those
// whose value `measure` reports as not qualifying; nullopt when none is left. `lower_bounds`
// holds (bound, index) for the items to consider, bound <= value(index) for each (a bound above
// the value breaks the order). An item is measured only while one not yet measured could still
// come before the smallest measured: (bound, index) < (value, index) of that item; so where the
// bounds are exact, the items after the first are measured only as far as ties of bound and
// index require. measure(index) -> std::optional<int64_t>: the value, or nullopt if the item
// does not qualify; called at most once per item, in (bound, index) order.
template <class Measure>
class LazyOrder {
 public:
  using Item = std::pair<int64_t, size_t>;  // (value or bound, index)

  LazyOrder(std::vector<Item> lower_bounds, Measure measure)
      : by_bound_(std::move(lower_bounds)), measure_(std::move(measure)) {
    std::sort(by_bound_.begin(), by_bound_.end());
  }

  std::optional<Item> next() {
    while (num_measured_ < by_bound_.size() &&
           (measured_.empty() || by_bound_[num_measured_] < measured_.top())) {
      const size_t index = by_bound_[num_measured_++].second;
      if (const std::optional<int64_t> value = measure_(index)) measured_.emplace(*value, index);
    }
    if (measured_.empty()) return std::nullopt;
    const Item best = measured_.top();
    measured_.pop();
    return best;
  }

  size_t num_measured() const { return num_measured_; }

 private:
  std::vector<Item> by_bound_;
  Measure measure_;
  size_t num_measured_ = 0;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> measured_;  // smallest on top
};

}  // namespace cobalt::plan::detail
