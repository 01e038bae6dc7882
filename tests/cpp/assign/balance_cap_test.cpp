#include "cobalt/assign/balance_cap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::assign {
namespace {

TEST(BalanceCap, IsTheLargestWholeLoadWithinTheTolerance) {
  // 4464 tasks on 16 ranks: mean 279, 1.05 * 279 = 292.95 -> 292 (ceil would give 293 = 1.0502).
  EXPECT_EQ(balance_cap(4464, 16, 0.05), 292);
  // Exact products are not lost to rounding: 1.05 * 20 = 21, 1.05 * 200 = 210.
  EXPECT_EQ(balance_cap(320, 16, 0.05), 21);
  EXPECT_EQ(balance_cap(1600, 8, 0.05), 210);
  // Zero tolerance: the mean, rounded up to the whole-task floor.
  EXPECT_EQ(balance_cap(160, 16, 0.0), 10);
  EXPECT_EQ(balance_cap(161, 16, 0.0), 11);
  // Few tasks: never below ceil(tasks / ranks), never above the tasks.
  EXPECT_EQ(balance_cap(3, 16, 0.05), 1);
  EXPECT_EQ(balance_cap(0, 4, 0.05), 0);
  EXPECT_EQ(balance_cap(7, 1, 0.05), 7);
  EXPECT_EQ(balance_cap(10, 2, 10.0), 10);
  EXPECT_EQ(balance_cap(10, 2, std::numeric_limits<double>::infinity()), 10);
  // 1.15 is stored below 1.15, 1.05 above 1.05: both products that are whole numbers stay whole.
  EXPECT_EQ(balance_cap(20, 1, 0.15), 20);  // capped at the tasks
  EXPECT_EQ(balance_cap(400, 20, 0.15), 23);
  // Large counts: 1.05 x 100000000019 / 2 = 52500000009.975 (a relative slack of 1e-12 gave
  // ...010).
  EXPECT_EQ(balance_cap(100000000019, 2, 0.05), 52500000009);
  // No overflow near the top of int64.
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(balance_cap(max, 1, 0.05), max);
  EXPECT_EQ(balance_cap(max, 2, 0.0), max / 2 + 1);
}

TEST(BalanceCap, MatchesExactRationalArithmeticOnRandomInputs) {
  // Tolerances p / 100: the cap is floor((100 + p) * tasks / (100 * ranks)), clamped to
  // [ceil(tasks / ranks), tasks], computed in integers.
  SplitMix64 rng(17);
  const uint64_t scales[] = {1000, 100000000, 1000000000000};
  for (int i = 0; i < 150000; ++i) {
    const int64_t tasks = static_cast<int64_t>(rng.below(scales[i % 3]));
    const int ranks = 1 + static_cast<int>(rng.below(512));
    const int percent = static_cast<int>(rng.below(40));
    int64_t expected = (100 + percent) * tasks / (100 * static_cast<int64_t>(ranks));
    expected = std::max(expected, (tasks + ranks - 1) / ranks);
    expected = std::min(expected, tasks);
    ASSERT_EQ(balance_cap(tasks, ranks, percent / 100.0), expected)
        << tasks << " tasks, " << ranks << " ranks, " << percent << "%";
  }
}

// The header's bound: exact for two-decimal tolerances t and task counts below
// 2^52 / (100 t (1 + t)), here up to t = 3 and task counts right up to the bound (log-uniform).
TEST(BalanceCap, ExactUpToTheDocumentedTaskCount) {
  SplitMix64 rng(29);
  for (int i = 0; i < 200000; ++i) {
    const int percent = 1 + static_cast<int>(rng.below(300));
    const double t = percent / 100.0;
    const double bound = std::ldexp(1.0, 52) / (100.0 * t * (1.0 + t));
    const double log_tasks = std::log(bound) * static_cast<double>(rng.below(1000001)) / 1e6;
    const auto tasks =
        std::min(static_cast<int64_t>(std::exp(log_tasks)), static_cast<int64_t>(bound) - 1);
    const int ranks = 1 + static_cast<int>(rng.below(512));
    const __int128 exact = static_cast<__int128>(100 + percent) * tasks / (100 * ranks);
    int64_t expected = std::max(static_cast<int64_t>(exact), (tasks + ranks - 1) / ranks);
    expected = std::min(expected, tasks);
    ASSERT_EQ(balance_cap(tasks, ranks, t), expected)
        << tasks << " tasks, " << ranks << " ranks, " << percent << "%";
  }
}

TEST(BalanceCap, RejectsBadArguments) {
  EXPECT_THROW(balance_cap(-1, 4, 0.05), Error);
  EXPECT_THROW(balance_cap(10, 0, 0.05), Error);
  EXPECT_THROW(balance_cap(10, 4, -0.01), Error);
  EXPECT_THROW(balance_cap(10, 4, std::numeric_limits<double>::quiet_NaN()), Error);
}

}  // namespace
}  // namespace cobalt::assign
