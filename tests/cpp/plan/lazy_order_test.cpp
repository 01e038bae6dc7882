// detail::LazyOrder (src/plan/lazy_order.hpp): on random values with many ties and lower bounds
// that are exact, loose or zero, the items come out exactly as sorting every qualifying
// (value, index) would give them, each measured at most once and in (bound, index) order; with
// exact bounds and distinct values the first item costs one measurement.
#include "plan/lazy_order.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "cobalt/core/rng.hpp"

namespace cobalt::plan::detail {
namespace {

TEST(LazyOrder, GivesTheSortedOrderOfTheQualifyingItems) {
  size_t num_saved = 0;
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    SplitMix64 rng(seed * 1000003);
    const size_t num_items = rng.below(40);
    const int64_t num_values = 1 + static_cast<int64_t>(rng.below(6));  // few values: many ties
    std::vector<int64_t> values(num_items);
    std::vector<bool> qualifies(num_items);
    std::vector<std::pair<int64_t, size_t>> bounds;
    for (size_t i = 0; i < num_items; ++i) {
      values[i] = static_cast<int64_t>(rng.below(num_values));
      qualifies[i] = rng.below(5) != 0;
      // Exact most of the time, else anything from 0 to the value.
      const auto bound =
          rng.below(4) != 0 ? values[i]
                            : static_cast<int64_t>(rng.below(static_cast<uint64_t>(values[i]) + 1));
      if (rng.below(8) != 0) bounds.emplace_back(bound, i);  // some items are not considered
    }
    std::vector<std::pair<int64_t, size_t>> want;
    for (const auto& [bound, i] : bounds) {
      if (qualifies[i]) want.emplace_back(values[i], i);
    }
    std::sort(want.begin(), want.end());
    std::vector<size_t> measured_items;
    std::vector<std::pair<int64_t, size_t>> measured_bounds;
    const auto measure = [&](size_t i) -> std::optional<int64_t> {
      measured_items.push_back(i);
      return qualifies[i] ? std::optional<int64_t>(values[i]) : std::nullopt;
    };
    LazyOrder order(bounds, measure);
    std::vector<std::pair<int64_t, size_t>> got;
    // Take a random number of items: the order must be right however far a caller goes.
    const size_t num_taken = rng.below(num_items + 2);
    while (got.size() < num_taken) {
      const auto item = order.next();
      if (!item) break;
      got.push_back(*item);
    }
    ASSERT_EQ(got.size(), std::min(num_taken, want.size())) << "seed " << seed;
    ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "seed " << seed;
    ASSERT_EQ(order.num_measured(), measured_items.size()) << "seed " << seed;
    // Each measured once, in (bound, index) order.
    std::vector<std::pair<int64_t, size_t>> sorted_bounds = bounds;
    std::sort(sorted_bounds.begin(), sorted_bounds.end());
    for (size_t k = 0; k < measured_items.size(); ++k) {
      ASSERT_EQ(measured_items[k], sorted_bounds[k].second) << "seed " << seed;
    }
    if (num_taken < want.size()) num_saved += bounds.size() - measured_items.size();
  }
  EXPECT_GT(num_saved, 1000u);  // stopping early saves measurements
}

TEST(LazyOrder, ExactBoundsMeasureOnlyWhatTiesRequire) {
  // Values 5, 3, 3, 7, 3 with exact bounds: the first item is (3, 1); the bound (3, 1) of item 1
  // comes first, and after it no (bound, index) is below (3, 1), so one measurement suffices.
  const std::vector<int64_t> values{5, 3, 3, 7, 3};
  std::vector<std::pair<int64_t, size_t>> bounds;
  for (size_t i = 0; i < values.size(); ++i) bounds.emplace_back(values[i], i);
  int num_calls = 0;
  LazyOrder order(bounds, [&](size_t i) -> std::optional<int64_t> {
    ++num_calls;
    return values[i];
  });
  EXPECT_EQ(order.next(), (std::pair<int64_t, size_t>{3, 1}));
  EXPECT_EQ(num_calls, 1);
  EXPECT_EQ(order.next(), (std::pair<int64_t, size_t>{3, 2}));
  EXPECT_EQ(order.next(), (std::pair<int64_t, size_t>{3, 4}));
  EXPECT_EQ(order.next(), (std::pair<int64_t, size_t>{5, 0}));
  EXPECT_EQ(num_calls, 4);
  EXPECT_EQ(order.next(), (std::pair<int64_t, size_t>{7, 3}));
  EXPECT_EQ(order.next(), std::nullopt);
  EXPECT_EQ(num_calls, 5);
}

}  // namespace
}  // namespace cobalt::plan::detail
