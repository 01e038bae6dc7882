// Each workload preset's measured statistics land in the ranges documented in docs/workloads.md and
// include/cobalt/workload/presets.hpp (checked on reduced sizes and two seeds, to stay fast).
#include "cobalt/workload/presets.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "cobalt/eval/trace_stats.hpp"
#include "cobalt/workload/synthetic.hpp"

namespace cobalt::workload {
namespace {

constexpr double kAny = std::numeric_limits<double>::infinity();

struct Range {
  double lo = -kAny;
  double hi = kAny;
};

// The documented target ranges (docs/workloads.md, "Presets").
struct Targets {
  std::string preset;
  PresetOverrides size;
  Range load_max_mean;
  Range top_partner;
  Range count_weighted;
  Range churn;
  Range static_ep;  // on G = R ranks
  Range source_locality;
};

PresetOverrides reduced(int steps, int64_t tokens, int layers) {
  PresetOverrides o;
  o.num_steps = steps;
  o.tokens_per_step = tokens;
  o.num_layers = layers;
  return o;
}

void expect_in(const char* what, double value, Range r, const std::string& where) {
  EXPECT_GE(value, r.lo) << where << ": " << what;
  EXPECT_LE(value, r.hi) << where << ": " << what;
}

class PresetStats : public ::testing::TestWithParam<Targets> {};

TEST_P(PresetStats, LandInDocumentedRanges) {
  const Targets& t = GetParam();
  for (uint64_t seed : {0u, 1u}) {
    PresetOverrides size = t.size;
    size.seed = seed;
    const WorkloadSpec spec = workload_preset(t.preset, size);
    const auto s = eval::compute_trace_stats(generate_trace(spec));
    const std::string where = t.preset + " seed " + std::to_string(seed);
    expect_in("load max/mean", s.load_max_mean, t.load_max_mean, where);
    expect_in("top-partner Ochiai", *s.ochiai_top_partner, t.top_partner, where);
    expect_in("count-weighted Ochiai", *s.ochiai_count_weighted, t.count_weighted, where);
    expect_in("hot-set churn", *s.hot_set_churn, t.churn, where);
    expect_in("static-EP imbalance", *s.static_ep_imbalance, t.static_ep, where);
    expect_in("source locality", *s.source_locality, t.source_locality, where);
  }
}

// clang-format off
// preset, reduced size (S, T_s, L) | load max/mean | top-partner | count-weighted | churn |
// static EP (G = R) | source locality
const Targets kTargets[] = {
    {"uniform", reduced(8, 8192, 2),
     {1.0, 1.2}, {0.0, 0.2}, {0.09, 0.13}, {}, {1.0, 1.1}, {0.0, 0.05}},
    {"skewed", reduced(10, 8192, 4),
     {5.0, 9.0}, {0.0, 0.3}, {0.0, 0.15}, {0.14, 0.22}, {1.8, 4.0}, {0.0, 0.06}},
    {"coactivated-early", reduced(10, 8192, 2),
     {2.5, 4.5}, {0.30, 0.42}, {0.10, 0.20}, {0.10, 0.20}, {}, {0.15, 0.30}},
    {"coactivated-late", reduced(10, 8192, 2),
     {2.0, 3.5}, {0.84, 0.94}, {0.68, 0.85}, {0.10, 0.20}, {}, {0.15, 0.30}},
    {"realistic", reduced(10, 8192, 2),
     {2.7, 5.0}, {0.38, 0.52}, {0.17, 0.28}, {0.12, 0.22}, {}, {0.12, 0.25}},
    {"paper-glm45air-ep32", reduced(4, 65536, 1),
     {2.0, 3.5}, {0.84, 0.93}, {0.68, 0.85}, {0.05, 0.25}, {}, {0.15, 0.35}},
    {"paper-topoep-640x8", reduced(10, 8192, 2),
     {7.0, 12.0}, {0.0, 0.2}, {0.0, 0.1}, {0.3, 0.9}, {7.5, 9.5}, {0.0, 0.12}},
    {"scale-1024", reduced(2, 131072, 1),
     {4.0, 7.0}, {0.75, 0.90}, {0.55, 0.80}, {0.0, 0.4}, {2.5, 4.5}, {0.2, 0.5}},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Workloads, PresetStats, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<Targets>& info) {
                           std::string name = info.param.preset;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace cobalt::workload
