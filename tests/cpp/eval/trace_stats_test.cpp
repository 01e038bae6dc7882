// compute_trace_stats on hand-made traces whose statistics are worked out below by hand, on the
// load-only form of the same trace, and through a file (TraceReader) against the in-memory result.
#include "cobalt/eval/trace_stats.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "testing/scoped_memory_limit.hpp"

namespace cobalt::eval {
namespace {

// E = 4, K = 2, one layer, two steps of three tokens, two source ranks:
//   step 0: t0 {0,1} src 0, t1 {0,1} src 0, t2 {0,2} src 1
//   step 1: t3 {2,3} src 0, t4 {2,3} src 1, t5 {1,2} src 1
io::TraceData hand_trace() {
  io::TraceData d;
  d.num_experts = 4;
  d.top_k = 2;
  d.num_layers = 1;
  d.num_tokens = 6;
  d.topk_ids = {0, 1, 0, 1, 0, 2, 2, 3, 2, 3, 1, 2};
  d.step_offsets = {0, 3, 6};
  d.source_rank = {0, 0, 1, 0, 1, 1};
  d.num_sources = 2;
  return d;
}

// The same trace as load-only counts [S=2, L=1, R=2, E=4].
io::TraceData hand_counts() {
  io::TraceData d;
  d.num_experts = 4;
  d.top_k = 2;
  d.num_layers = 1;
  d.num_sources = 2;
  d.num_count_steps = 2;
  d.counts = {2, 2, 0, 0, /* s0 r0 */ 1, 0, 1, 0, /* s0 r1 */
              0, 0, 1, 1, /* s1 r0 */ 0, 1, 2, 1 /* s1 r1 */};
  return d;
}

// Hand-computed values.
//   loads w = (3, 3, 4, 2): max/mean = 4/3; per step (3,2,1,0) and (0,1,3,2): 2 and 2.
//   c01 = 2, c02 = 1, c12 = 1, c23 = 2; Ochiai O01 = 2/3, O02 = O12 = 1/sqrt(12), O23 = 2/sqrt(8).
//   top-3 hot sets {0,1,2} -> {1,2,3}: churn 1/3. Static EP on 2 ranks: (5,1) and (1,5): 5/3.
//   per-source tasks (2,2,1,1) and (1,1,3,1) vs global (3,3,4,2)/12: TV 1/6 each.
const double kO01 = 2.0 / 3.0, kO02 = 1.0 / std::sqrt(12.0), kO23 = 2.0 / std::sqrt(8.0);
const double kCountWeighted = (2 * kO01 + kO02 + kO02 + 2 * kO23) / 6.0;
const double kTopPartner = (3 * kO01 + 3 * kO01 + 4 * kO23 + 2 * kO23) / 12.0;

TraceStatsOptions hot3() {
  TraceStatsOptions o;
  o.hot_count = 3;
  return o;
}

void expect_count_level(const TraceStats& s) {
  EXPECT_EQ(s.num_experts, 4);
  EXPECT_EQ(s.top_k, 2);
  EXPECT_EQ(s.num_layers, 1);
  EXPECT_EQ(s.num_steps, 2);
  EXPECT_EQ(s.num_sources, 2);
  EXPECT_EQ(s.hot_count, 3);
  EXPECT_DOUBLE_EQ(s.load_max_mean, 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.load_max_mean_step, 2.0);
  EXPECT_DOUBLE_EQ(*s.hot_set_churn, 1.0 / 3.0);
  EXPECT_EQ(s.static_ep_ranks, 2);
  EXPECT_DOUBLE_EQ(*s.static_ep_imbalance, 5.0 / 3.0);
  EXPECT_NEAR(*s.source_locality, 1.0 / 6.0, 1e-12);
  ASSERT_EQ(s.layers.size(), 1u);
  EXPECT_DOUBLE_EQ(s.layers[0].load_max_mean, s.load_max_mean);
}

// The sources' table has a row per source with tokens: a trace that declares 2^20 sources for its
// six tokens (E = 1024) is summarised in a few MB (a dense [R, E] table took 8.6 GB), with the
// same locality as the trace declaring only the sources it uses.
TEST(TraceStats, SourcesWithoutTokensTakeNoMemory) {
  const testing::ScopedMemoryLimit limit("256M");
  io::TraceData d = hand_trace();
  d.num_experts = 1024;
  d.source_rank = {7, 7, 1000000, 7, 1000000, 1000000};  // sources 0 and 1 renamed, same order
  d.num_sources = 1 << 20;
  const auto wide = compute_trace_stats(d, hot3());
  const auto narrow = compute_trace_stats(
      [] {
        io::TraceData n = hand_trace();
        n.num_experts = 1024;
        return n;
      }(),
      hot3());
  ASSERT_TRUE(wide.source_locality && narrow.source_locality);
  EXPECT_EQ(*wide.source_locality, *narrow.source_locality);
  EXPECT_NEAR(*wide.source_locality, 1.0 / 6.0, 1e-12);
}

TEST(TraceStats, HandTrace) {
  const auto s = compute_trace_stats(hand_trace(), hot3());
  expect_count_level(s);
  EXPECT_FALSE(s.load_only);
  EXPECT_EQ(s.num_tokens, 6);
  EXPECT_NEAR(*s.ochiai_count_weighted, kCountWeighted, 1e-12);
  EXPECT_NEAR(*s.ochiai_top_partner, kTopPartner, 1e-12);
}

TEST(TraceStats, LoadOnlyTraceReportsWhatCountsSupport) {
  const auto s = compute_trace_stats(hand_counts(), hot3());
  expect_count_level(s);
  EXPECT_TRUE(s.load_only);
  EXPECT_EQ(s.num_tokens, 0);
  EXPECT_FALSE(s.ochiai_count_weighted.has_value());
  EXPECT_FALSE(s.ochiai_top_partner.has_value());
}

TEST(TraceStats, CountWeightedOchiaiIsAbsentWithoutPairs) {
  // Top-1: no token chooses two experts, so the count-weighted mean is 0/0; every Ochiai is 0,
  // so the top-partner mean is 0.
  io::TraceData d;
  d.num_experts = 4;
  d.top_k = 1;
  d.num_layers = 1;
  d.num_tokens = 4;
  d.topk_ids = {0, 1, 2, 2};
  const auto s = compute_trace_stats(d);
  EXPECT_FALSE(s.ochiai_count_weighted.has_value());
  EXPECT_FALSE(s.layers[0].ochiai_count_weighted.has_value());
  ASSERT_TRUE(s.ochiai_top_partner.has_value());
  EXPECT_EQ(*s.ochiai_top_partner, 0.0);
}

TEST(TraceStats, ReportsProgressOncePerLayer) {
  auto d = hand_trace();
  d.num_layers = 2;
  d.topk_ids.insert(d.topk_ids.end(), d.topk_ids.begin(), d.topk_ids.end());
  std::vector<std::pair<int, int>> calls;
  TraceStatsOptions o;
  o.progress = [&calls](int done, int total) { calls.emplace_back(done, total); };
  const auto s = compute_trace_stats(d, o);
  EXPECT_EQ(calls, (std::vector<std::pair<int, int>>{{1, 2}, {2, 2}}));
  EXPECT_DOUBLE_EQ(s.load_max_mean, 4.0 / 3.0);  // the same layer twice
}

TEST(TraceStats, RankOverrideAndHotCount) {
  TraceStatsOptions o;
  o.hot_count = 1;  // hottest: e0 then e2
  o.num_ranks = 4;  // one expert per rank: static EP imbalance = expert max/mean per step
  const auto s = compute_trace_stats(hand_trace(), o);
  EXPECT_DOUBLE_EQ(*s.hot_set_churn, 1.0);
  EXPECT_EQ(s.static_ep_ranks, 4);
  EXPECT_DOUBLE_EQ(*s.static_ep_imbalance, 2.0);
}

TEST(TraceStats, AbsentWhenTheTraceCannotSupportIt) {
  auto d = hand_trace();
  d.source_rank.clear();
  d.num_sources = 0;
  d.step_offsets.clear();  // one step
  const auto s = compute_trace_stats(d);
  EXPECT_EQ(s.num_sources, 0);
  EXPECT_EQ(s.num_steps, 1);
  EXPECT_FALSE(s.hot_set_churn.has_value());
  EXPECT_FALSE(s.source_locality.has_value());
  EXPECT_FALSE(s.static_ep_imbalance.has_value());
  EXPECT_EQ(s.static_ep_ranks, 0);
  EXPECT_DOUBLE_EQ(s.load_max_mean, 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.load_max_mean_step, 4.0 / 3.0);
  EXPECT_NEAR(*s.ochiai_top_partner, kTopPartner, 1e-12);
}

TEST(TraceStats, SkipsEmptySteps) {
  auto d = hand_trace();
  d.step_offsets = {0, 3, 3, 6};
  const auto s = compute_trace_stats(d, hot3());
  EXPECT_EQ(s.num_steps, 3);
  EXPECT_DOUBLE_EQ(*s.hot_set_churn, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.load_max_mean_step, 2.0);
}

TEST(TraceStats, AveragesLayers) {
  auto d = hand_trace();
  d.num_layers = 2;
  // Layer 1: every token picks {0, 1}: loads (6, 6, 0, 0), max/mean 2, Ochiai 1.
  for (int t = 0; t < 6; ++t) {
    d.topk_ids.push_back(0);
    d.topk_ids.push_back(1);
  }
  const auto s = compute_trace_stats(d);
  ASSERT_EQ(s.layers.size(), 2u);
  EXPECT_DOUBLE_EQ(s.layers[1].load_max_mean, 2.0);
  EXPECT_DOUBLE_EQ(*s.layers[1].ochiai_top_partner, 1.0);
  EXPECT_DOUBLE_EQ(s.load_max_mean, (4.0 / 3.0 + 2.0) / 2.0);
  EXPECT_NEAR(*s.ochiai_top_partner, (kTopPartner + 1.0) / 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(*s.layers[1].hot_set_churn, 0.0);
}

TEST(TraceStats, HotCountAboveTheExpertsIsCappedAndReported) {
  TraceStatsOptions o;
  o.hot_count = 100;  // E = 4
  const auto s = compute_trace_stats(hand_trace(), o);
  EXPECT_EQ(s.hot_count, 4);
  ASSERT_TRUE(s.hot_set_churn.has_value());
  EXPECT_DOUBLE_EQ(*s.hot_set_churn, 0.0);  // the whole expert set never churns
}

TEST(TraceStats, RejectsBadOptionsAndData) {
  TraceStatsOptions o;
  o.hot_count = 0;
  EXPECT_THROW(compute_trace_stats(hand_trace(), o), Error);
  o = {};
  o.num_ranks = -1;
  EXPECT_THROW(compute_trace_stats(hand_trace(), o), Error);
  auto d = hand_trace();
  d.topk_ids[3] = 9;  // out of range
  EXPECT_THROW(compute_trace_stats(d), Error);
  d = hand_trace();
  d.topk_ids.pop_back();  // wrong size
  EXPECT_THROW(compute_trace_stats(d), Error);
}

TEST(TraceStats, FileAndMemoryAgree) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("cobalt_trace_stats_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& data : {hand_trace(), hand_counts()}) {
    const std::string path = (dir / "t.safetensors").string();
    io::write_trace(path, data);
    const io::TraceReader reader(path);
    const auto from_file = compute_trace_stats(reader, hot3());
    const auto from_memory = compute_trace_stats(data, hot3());
    EXPECT_EQ(from_file.load_only, from_memory.load_only);
    EXPECT_EQ(from_file.num_steps, from_memory.num_steps);
    EXPECT_EQ(from_file.num_sources, from_memory.num_sources);
    EXPECT_DOUBLE_EQ(from_file.load_max_mean, from_memory.load_max_mean);
    EXPECT_DOUBLE_EQ(from_file.load_max_mean_step, from_memory.load_max_mean_step);
    EXPECT_EQ(from_file.ochiai_top_partner, from_memory.ochiai_top_partner);
    EXPECT_EQ(from_file.ochiai_count_weighted, from_memory.ochiai_count_weighted);
    EXPECT_EQ(from_file.hot_set_churn, from_memory.hot_set_churn);
    EXPECT_EQ(from_file.static_ep_imbalance, from_memory.static_ep_imbalance);
    EXPECT_EQ(from_file.source_locality, from_memory.source_locality);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cobalt::eval
