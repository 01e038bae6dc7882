// The synthetic trace generator: determinism (per seed, across thread counts), validity of every
// trace it makes, and that each knob moves the statistic it is documented to control.
#include "cobalt/workload/synthetic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/eval/trace_stats.hpp"

namespace cobalt::workload {
namespace {

WorkloadSpec small_spec() {
  WorkloadSpec spec;
  spec.num_experts = 32;
  spec.top_k = 4;
  spec.num_layers = 2;
  spec.num_steps = 6;
  spec.tokens_per_step = 2000;
  spec.num_sources = 4;
  spec.zipf_exponent = 0.6;
  spec.hot_churn = 0.2;
  spec.group_size = 4;
  spec.group_affinity = 0.5;
  spec.group_churn = 0.05;
  spec.num_domains = 2;
  spec.domain_locality = 0.4;
  return spec;
}

// Checks every structural promise of generate_trace for `spec`.
void expect_valid_trace(const WorkloadSpec& spec, const io::TraceData& data) {
  SCOPED_TRACE(spec.name);
  ASSERT_EQ(data.num_experts, spec.num_experts);
  ASSERT_EQ(data.top_k, spec.top_k);
  ASSERT_EQ(data.num_layers, spec.num_layers);
  ASSERT_EQ(data.num_tokens, spec.num_steps * spec.tokens_per_step);
  ASSERT_EQ(data.num_sources, spec.num_sources);
  ASSERT_EQ(data.topk_ids.size(),
            static_cast<size_t>(spec.num_layers) * data.num_tokens * spec.top_k);
  validate_topk_rows(data.topk_ids, spec.top_k, spec.num_experts, "generated trace");
  ASSERT_EQ(data.step_offsets.size(), static_cast<size_t>(spec.num_steps) + 1);
  for (int s = 0; s <= spec.num_steps; ++s)
    EXPECT_EQ(data.step_offsets[s], s * spec.tokens_per_step);
  ASSERT_EQ(data.source_rank.size(), static_cast<size_t>(data.num_tokens));
  for (int64_t t = 0; t < data.num_tokens; ++t) {
    const int64_t i = t % spec.tokens_per_step;
    ASSERT_EQ(data.source_rank[t], i * spec.num_sources / spec.tokens_per_step) << "token " << t;
  }
  EXPECT_NO_THROW(io::validate_trace_data(data, "generated trace"));
  EXPECT_EQ(data.metadata.at("workload"), spec.name);
  EXPECT_EQ(data.metadata.at("seed"), std::to_string(spec.seed));
}

// The trace restricted to steps [first, end) (same layers).
io::TraceData slice_steps(const io::TraceData& data, int first, int end) {
  io::TraceData out = data;
  const int64_t begin_tok = data.step_offsets[first], end_tok = data.step_offsets[end];
  out.num_tokens = end_tok - begin_tok;
  out.topk_ids.clear();
  for (int l = 0; l < data.num_layers; ++l) {
    const auto* layer = data.topk_ids.data() + l * data.num_tokens * data.top_k;
    out.topk_ids.insert(out.topk_ids.end(), layer + begin_tok * data.top_k,
                        layer + end_tok * data.top_k);
  }
  out.source_rank.assign(data.source_rank.begin() + begin_tok, data.source_rank.begin() + end_tok);
  out.step_offsets.clear();
  for (int s = first; s <= end; ++s) out.step_offsets.push_back(data.step_offsets[s] - begin_tok);
  return out;
}

TEST(SyntheticWorkload, SameSeedSameTrace) {
  const auto spec = small_spec();
  const auto a = generate_trace(spec);
  const auto b = generate_trace(spec);
  EXPECT_EQ(a.topk_ids, b.topk_ids);
  EXPECT_EQ(a.source_rank, b.source_rank);
  EXPECT_EQ(a.step_offsets, b.step_offsets);
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(SyntheticWorkload, DifferentSeedDifferentTrace) {
  auto spec = small_spec();
  const auto a = generate_trace(spec);
  spec.seed = 1;
  const auto b = generate_trace(spec);
  ASSERT_EQ(a.topk_ids.size(), b.topk_ids.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.topk_ids.size(); ++i) differing += a.topk_ids[i] != b.topk_ids[i];
  EXPECT_GT(differing, static_cast<int64_t>(a.topk_ids.size() / 2));
  EXPECT_NE(a.metadata.at("seed"), b.metadata.at("seed"));
}

TEST(SyntheticWorkload, LayersDiffer) {
  const auto spec = small_spec();
  const auto data = generate_trace(spec);
  const size_t layer_size = static_cast<size_t>(data.num_tokens) * data.top_k;
  EXPECT_FALSE(std::equal(data.topk_ids.begin(), data.topk_ids.begin() + layer_size,
                          data.topk_ids.begin() + layer_size));
}

TEST(SyntheticWorkload, IndependentOfThreadCount) {
  auto spec = small_spec();
  spec.tokens_per_step = 40000;  // several work chunks per step
  spec.num_steps = 2;
  GenerateOptions one, three;
  three.num_threads = 3;
  EXPECT_EQ(generate_trace(spec, one).topk_ids, generate_trace(spec, three).topk_ids);
}

TEST(SyntheticWorkload, ReportsProgressPerLayerAndStep) {
  const auto spec = small_spec();
  GenerateOptions options;
  std::vector<int64_t> done;
  options.progress = [&](int64_t d, int64_t total) {
    EXPECT_EQ(total, spec.num_layers * spec.num_steps);
    done.push_back(d);
  };
  generate_trace(spec, options);
  ASSERT_EQ(done.size(), static_cast<size_t>(spec.num_layers * spec.num_steps));
  EXPECT_EQ(done.back(), spec.num_layers * spec.num_steps);
}

TEST(SyntheticWorkload, ValidTracesAcrossEdgeSpecs) {
  std::vector<WorkloadSpec> specs;
  auto base = small_spec();
  base.name = "base";
  specs.push_back(base);
  auto full = base;  // K = E: every token selects every expert
  full.name = "k-equals-e";
  full.num_experts = 8;
  full.top_k = 8;
  full.group_size = 3;
  full.num_domains = 2;
  specs.push_back(full);
  auto singletons = base;  // groups of one, full affinity, full locality
  singletons.name = "singletons";
  singletons.group_size = 1;
  singletons.group_affinity = 1.0;
  singletons.domain_locality = 1.0;
  singletons.num_domains = 4;
  specs.push_back(singletons);
  auto one_group = base;  // a group larger than the local-copy limit, full affinity
  one_group.name = "one-big-group";
  one_group.num_experts = 200;
  one_group.top_k = 16;
  one_group.group_size = 200;
  one_group.group_affinity = 1.0;
  one_group.num_domains = 1;
  specs.push_back(one_group);
  auto extreme = base;  // heavy skew on contiguous ids, full churn, tiny domains
  extreme.name = "extreme";
  extreme.zipf_exponent = 4.0;
  extreme.popularity_order = PopularityOrder::kById;
  extreme.hot_churn = 1.0;
  extreme.hot_count = 31;
  extreme.group_churn = 1.0;
  extreme.num_domains = 4;
  extreme.domain_locality = 1.0;
  extreme.final_group_affinity = 1.0;
  specs.push_back(extreme);
  auto tiny = base;  // fewer tokens per step than sources
  tiny.name = "tiny";
  tiny.tokens_per_step = 3;
  specs.push_back(tiny);
  for (const auto& spec : specs) expect_valid_trace(spec, generate_trace(spec));
}

TEST(SyntheticWorkload, RejectsInvalidSpec) {
  auto spec = small_spec();
  spec.group_affinity = -1;
  EXPECT_THROW(generate_trace(spec), Error);
  GenerateOptions negative_threads;
  negative_threads.num_threads = -1;
  EXPECT_THROW(generate_trace(small_spec(), negative_threads), Error);
}

// --- Knobs move their statistics
// ------------------------------------------------------------------

eval::TraceStats stats_of(const WorkloadSpec& spec) {
  return eval::compute_trace_stats(generate_trace(spec));
}

WorkloadSpec knob_spec() {
  WorkloadSpec spec;
  spec.num_experts = 64;
  spec.top_k = 8;
  spec.num_layers = 1;
  spec.num_steps = 8;
  spec.tokens_per_step = 4096;
  spec.num_sources = 8;
  return spec;
}

TEST(SyntheticWorkload, UniformSpecIsUniform) {
  const auto s = stats_of(knob_spec());
  EXPECT_LT(s.load_max_mean, 1.15);
  EXPECT_LT(*s.source_locality, 0.06);
  // Chance co-activation of independent picks: c_ij / sqrt(w_i w_j) ~ (K - 1) / (E - 1).
  EXPECT_NEAR(*s.ochiai_count_weighted, 7.0 / 63.0, 0.02);
}

TEST(SyntheticWorkload, ZipfExponentControlsLoadSkew) {
  auto spec = knob_spec();
  double previous = 0;
  for (double a : {0.0, 0.4, 0.8, 1.2}) {
    spec.zipf_exponent = a;
    const double skew = stats_of(spec).load_max_mean;
    EXPECT_GT(skew, previous + 0.5) << "exponent " << a;
    EXPECT_LE(skew, 64.0 / 8.0 + 1e-9);  // an expert is picked at most once per token
    previous = skew;
  }
}

TEST(SyntheticWorkload, LayerSkewSpreadSpreadsLayers) {
  auto spec = knob_spec();
  spec.num_layers = 4;
  spec.zipf_exponent = 0.6;
  auto spread_of = [&](double spread) {
    spec.layer_skew_spread = spread;
    const auto s = stats_of(spec);
    double lo = 1e9, hi = 0;
    for (const auto& l : s.layers) {
      lo = std::min(lo, l.load_max_mean);
      hi = std::max(hi, l.load_max_mean);
    }
    return hi - lo;
  };
  EXPECT_LT(spread_of(0.0), 0.6);
  EXPECT_GT(spread_of(0.6), 1.5);
}

TEST(SyntheticWorkload, HotChurnControlsHotSetChurn) {
  auto spec = knob_spec();
  spec.num_steps = 12;
  spec.zipf_exponent = 1.0;  // clear gaps between the hot ranks, so sampling noise is small
  for (double churn : {0.0, 0.125, 0.25, 0.5}) {
    spec.hot_churn = churn;
    EXPECT_NEAR(*stats_of(spec).hot_set_churn, churn, 0.06) << "hot_churn " << churn;
  }
}

TEST(SyntheticWorkload, GroupAffinityControlsOchiai) {
  auto spec = knob_spec();
  spec.group_size = 8;
  double previous_top = 0, previous_weighted = 0;
  for (double p : {0.0, 0.5, 0.8, 1.0}) {
    spec.group_affinity = p;
    const auto s = stats_of(spec);
    EXPECT_GT(*s.ochiai_top_partner, previous_top + 0.1) << "affinity " << p;
    EXPECT_GT(*s.ochiai_count_weighted, previous_weighted + 0.05) << "affinity " << p;
    // Documented approximation: top-partner ~ p^2 (plus a chance floor) when group_size = K.
    EXPECT_NEAR(*s.ochiai_top_partner, std::max(p * p, 0.15), 0.12) << "affinity " << p;
    previous_top = *s.ochiai_top_partner;
    previous_weighted = *s.ochiai_count_weighted;
  }
}

TEST(SyntheticWorkload, AffinityRampStrengthensCoactivation) {
  auto spec = knob_spec();
  spec.num_steps = 10;
  spec.group_affinity = 0.5;
  spec.final_group_affinity = 0.95;
  const auto data = generate_trace(spec);
  const auto early = eval::compute_trace_stats(slice_steps(data, 0, 2));
  const auto late = eval::compute_trace_stats(slice_steps(data, 8, 10));
  EXPECT_LT(*early.ochiai_top_partner, 0.4);
  EXPECT_GT(*late.ochiai_top_partner, 0.75);
}

TEST(SyntheticWorkload, GroupChurnChangesPartners) {
  auto spec = knob_spec();
  spec.num_steps = 10;
  spec.group_affinity = 1.0;
  const double fixed = *stats_of(spec).ochiai_top_partner;
  spec.group_churn = 0.3;
  const double churned = *stats_of(spec).ochiai_top_partner;
  EXPECT_GT(fixed, 0.9);
  EXPECT_LT(churned, fixed - 0.2);  // whole-trace pairs are diluted as partners change
}

TEST(SyntheticWorkload, DomainLocalityControlsSourceLocality) {
  auto spec = knob_spec();
  spec.num_domains = 4;
  for (double lambda : {0.0, 0.3, 0.6, 1.0}) {
    spec.domain_locality = lambda;
    // Documented: ~ lambda (1 - 1/D) for balanced domains, plus a sampling floor.
    EXPECT_NEAR(*stats_of(spec).source_locality, lambda * 0.75, 0.07) << "locality " << lambda;
  }
}

TEST(SyntheticWorkload, ByIdOrderConcentratesStaticEpLoad) {
  auto spec = knob_spec();
  spec.zipf_exponent = 0.8;
  const double shuffled = *stats_of(spec).static_ep_imbalance;  // G = R = 8
  spec.popularity_order = PopularityOrder::kById;
  const double by_id = *stats_of(spec).static_ep_imbalance;
  EXPECT_GT(by_id, shuffled + 1.0);
  EXPECT_GT(by_id, 2.5);
}

}  // namespace
}  // namespace cobalt::workload
