// The report's SVG helpers (src/eval/svg.hpp) on inputs a valid replay does not produce but an
// extreme option could: axis ticks must stay few, finite and non-empty.
#include "eval/svg.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace cobalt::eval::svg {
namespace {

void expect_sane(const std::vector<double>& t, double lo, double hi) {
  ASSERT_FALSE(t.empty()) << lo << " " << hi;
  EXPECT_LE(t.size(), 1001u) << lo << " " << hi;
  for (double v : t) EXPECT_TRUE(std::isfinite(v)) << lo << " " << hi;
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]) << lo << " " << hi;
}

TEST(Svg, TicksOfOrdinaryRanges) {
  EXPECT_EQ(ticks(0, 10), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(ticks(0, 7, 5, true), (std::vector<double>{0, 2, 4, 6, 8}));
  const auto unit = ticks(0, 1);
  ASSERT_EQ(unit.size(), 6u);
  EXPECT_NEAR(unit[3], 0.6, 1e-12);
  const auto flat = ticks(3, 3);  // an empty range becomes [3, 4]
  ASSERT_EQ(flat.size(), 6u);
  EXPECT_EQ(flat.front(), 3);
  EXPECT_NEAR(flat.back(), 4, 1e-12);
}

// --planner-time-scale 1e308 made modelled times infinite: ticks(0, inf) read out.back() of an
// empty vector (a segfault).
TEST(Svg, TicksOfNonFiniteAndHugeRanges) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double nan = std::nan("");
  const double cases[][2] = {{0, inf},       {-inf, inf},     {nan, nan},       {0, nan},
                             {1e308, 1e308}, {-1e308, 1e308}, {1e17, 1e17 + 1}, {0, 1e300},
                             {inf, inf},     {5, -5}};
  for (const auto& c : cases) {
    expect_sane(ticks(c[0], c[1]), c[0], c[1]);
    expect_sane(ticks(c[0], c[1], 5, true), c[0], c[1]);
  }
  Frame f;
  f.y1 = inf;
  const std::string out = axes(f, "x", "y");
  EXPECT_TRUE(std::isfinite(f.y0) && std::isfinite(f.y1));
  EXPECT_EQ(out.find("nan"), std::string::npos);
  EXPECT_EQ(out.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace cobalt::eval::svg
