// Simulator: aggregates agree with the per-step values, static EP's modelled time recomputed from
// scratch, the observer sees every (step, layer), load-only traces skip token-level policies.
#include "cobalt/eval/simulator.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "cobalt/core/assignment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

SimulationOptions options_for(const StepSource& source, const Topology& topo,
                              std::vector<std::string> policies) {
  SimulationOptions o;
  auto& c = o.policy_config;
  c.topology = topo;
  c.num_experts = source.num_experts();
  c.top_k = source.top_k();
  c.num_layers = source.num_layers();
  c.slots_per_rank = slots_for_rho(c.num_experts, topo.num_ranks(), 0.5);
  c.steps_per_global_plan = 3;
  c.planner_restarts = 2;
  o.policies = std::move(policies);
  o.warmup_steps = 2;
  o.cost = make_cost_params(cluster_preset("4x8-b200"), model_preset("olmoe-1b-7b"));
  return o;
}

TEST(Simulator, StaticModelledTimeRecomputedFromScratch) {
  const auto data = testing::random_trace(5, 6, 1500, 2, 32, 4, 16);
  auto source = make_step_source(data);
  const Topology topo(2, 16);
  const auto options = options_for(*source, topo, {"static"});
  const auto result = simulate(*source, options);
  ASSERT_EQ(result.policies.size(), 1u);
  const auto& p = result.policies[0];
  // Static EP: expert e on rank floor(e G / E); nothing moves, nothing to synchronise or plan.
  const CostParams& c = options.cost;
  double total = 0;
  StepScratch scratch;
  for (int s = options.warmup_steps; s < source->num_steps(); ++s) {
    double step = 0;
    for (int l = 0; l < source->num_layers(); ++l) {
      auto batch = source->batch(s, l, topo.num_ranks(), scratch);
      std::vector<RankId> exec;
      for (ExpertId e : batch.topk_ids()) exec.push_back(e * topo.num_ranks() / 32);
      std::vector<int64_t> loads(topo.num_ranks(), 0);
      for (RankId r : exec) ++loads[r];
      const double compute = static_cast<double>(*std::max_element(loads.begin(), loads.end())) *
                             c.flops_per_task() / c.achievable_flops;
      const ExchangeVolume v = exchange_volume(batch, exec, topo);
      double inter = 0, intra = 0;
      for (int n = 0; n < topo.num_nodes(); ++n) {
        inter = std::max(inter, std::max(v.node_out[n], v.node_in[n]) * c.token_bytes() /
                                    c.ib_bytes_per_s_per_node);
      }
      for (int r = 0; r < topo.num_ranks(); ++r) {
        intra = std::max(intra, std::max(v.nvlink_out[r], v.nvlink_in[r]) * c.token_bytes() /
                                    c.nvlink_bytes_per_s);
      }
      step += compute + 4 * std::max(inter, intra);
    }
    EXPECT_NEAR(p.step_time_s[s], step, 1e-12 * step) << "step " << s;
    total += step;
  }
  EXPECT_NEAR(p.sim_step_time_s, total / (source->num_steps() - options.warmup_steps),
              1e-12 * total);
  EXPECT_EQ(p.time.migration_s, 0);
  EXPECT_EQ(p.time.grad_sync_s, 0);
  EXPECT_DOUBLE_EQ(p.speedup_vs_static, 1.0);
  EXPECT_DOUBLE_EQ(p.replicas_per_expert_mean, 1.0);
}

// Counts every (step, layer) it is shown.
class CountingObserver final : public ReplayObserver {
 public:
  void begin_policy(const std::string& name) override { names.push_back(name); }
  void on_step(int step, int layer, const RoutingBatch& batch, std::span<const RankId> exec,
               const ExpertLayout& layout) override {
    ++calls;
    tasks += static_cast<int64_t>(exec.size());
    EXPECT_NO_THROW(validate_assignment(batch, layout, exec));
  }
  std::vector<std::string> names;
  int calls = 0;
  int64_t tasks = 0;
};

// Collects, per policy, the imbalance and the layout's floor of every measured (step, layer).
class FloorObserver final : public ReplayObserver {
 public:
  explicit FloorObserver(int first_measured_step) : first_measured_step_(first_measured_step) {}
  void begin_policy(const std::string&) override {
    layers.emplace_back();
    bound_sums.push_back(0.0);
  }
  void on_step(int step, int, const RoutingBatch& batch, std::span<const RankId> exec,
               const ExpertLayout& layout) override {
    if (step < first_measured_step_ || batch.num_tasks() == 0) return;
    std::vector<int64_t> counts(batch.num_experts(), 0);
    for (ExpertId e : batch.topk_ids()) ++counts[e];
    layers.back().push_back(
        {imbalance(rank_loads(exec, layout.num_ranks())), imbalance_floor(counts, layout)});
    bound_sums.back() += whole_task_imbalance_bound(batch.num_tasks(), layout.num_ranks());
  }
  std::vector<std::vector<std::pair<double, double>>> layers;  // [policy][layer-step] (imb, floor)
  std::vector<double> bound_sums;  // [policy] sum of the whole-task bounds

 private:
  int first_measured_step_;
};

// imbalance_floor_mean is the mean of the layouts' floors over the measured (step, layer); no
// policy's assignment goes below its layout's floor, and static EP's single replicas leave no
// choice (its imbalance is its floor). imbalance_bound_mean is the mean of the whole-task bounds,
// below every floor (5996 tasks on 16 ranks: 375 / 374.75).
TEST(Simulator, ImbalanceFloorIsTheMeanOfTheLayoutsFloors) {
  const auto data = testing::random_trace(5, 7, 1499, 2, 48, 4, 16);
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 16), {"static", "cobalt", "cobalt+", "eplb"});
  FloorObserver observer(options.warmup_steps);
  options.observer = &observer;
  const auto result = simulate(*source, options);
  ASSERT_EQ(observer.layers.size(), result.policies.size());
  for (size_t i = 0; i < result.policies.size(); ++i) {
    const auto& p = result.policies[i];
    const auto& layers = observer.layers[i];
    ASSERT_EQ(layers.size(), 10u) << p.name;  // 5 measured steps x 2 layers
    double floor_sum = 0;
    for (const auto& [imb, floor] : layers) {
      EXPECT_LE(floor, imb + 1e-12) << p.name;
      EXPECT_GE(floor, 1.0) << p.name;
      if (p.name == "static") EXPECT_DOUBLE_EQ(floor, imb);
      floor_sum += floor;
    }
    EXPECT_NEAR(p.imbalance_floor_mean, floor_sum / 10, 1e-12) << p.name;
    EXPECT_LE(p.imbalance_floor_mean, p.imbalance_mean + 1e-12) << p.name;
    EXPECT_NEAR(p.imbalance_bound_mean, observer.bound_sums[i] / 10, 1e-12) << p.name;
    EXPECT_LE(p.imbalance_bound_mean, p.imbalance_floor_mean + 1e-12) << p.name;
    EXPECT_GT(p.imbalance_bound_mean, 1.0) << p.name;
    EXPECT_DOUBLE_EQ(p.imbalance_bound_mean, result.policies[0].imbalance_bound_mean) << p.name;
  }
}

TEST(Simulator, AggregatesMatchPerStepValuesAndTheObserverSeesEverything) {
  const auto data = testing::random_trace(7, 8, 1200, 2, 32, 4, 16);
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 16), {"static", "cobalt"});
  CountingObserver observer;
  options.observer = &observer;
  const auto result = simulate(*source, options);
  EXPECT_EQ(observer.names, (std::vector<std::string>{"static", "cobalt"}));
  EXPECT_EQ(observer.calls, 2 * 8 * 2);
  EXPECT_EQ(observer.tasks, 2 * 2 * data.num_tokens * 4);
  for (const auto& p : result.policies) {
    int64_t v = 0;
    double time = 0;
    for (int s = options.warmup_steps; s < 8; ++s) {
      v += p.step_cross_node_tokens[s];
      time += p.step_time_s[s];
    }
    EXPECT_EQ(p.cross_node_tokens, v) << p.name;
    EXPECT_NEAR(p.sim_step_time_s, time / 6, 1e-12 * time) << p.name;
    EXPECT_NEAR(p.time.total(), p.sim_step_time_s, 1e-15) << p.name;
    EXPECT_DOUBLE_EQ(p.cross_node_bytes, static_cast<double>(v) * options.cost.token_bytes() * 4);
    EXPECT_EQ(p.final_layouts.size(), 2u);
    EXPECT_GE(p.cross_node_tokens_no_dedup, p.cross_node_tokens);
  }
  const auto& cobalt = result.policies[1];
  EXPECT_GT(cobalt.counters.num_global_plans, 0);
  EXPECT_GT(cobalt.replicas_per_expert_mean, 1.0);
  EXPECT_GT(cobalt.time.grad_sync_s, 0);  // replicas must synchronise gradients
  EXPECT_LT(cobalt.cross_node_tokens, result.policies[0].cross_node_tokens);
  EXPECT_NEAR(cobalt.cross_node_reduction_vs_static,
              1.0 - static_cast<double>(cobalt.cross_node_tokens) /
                        static_cast<double>(result.policies[0].cross_node_tokens),
              1e-12);
  EXPECT_NEAR(cobalt.speedup_vs_static, result.policies[0].sim_step_time_s / cobalt.sim_step_time_s,
              1e-12);
}

// A load-only trace: [steps, layers, sources, E] counts drawn uniformly from [0, 50).
io::TraceData random_load_only_trace(int num_experts, int top_k, int num_layers, int num_steps,
                                     uint64_t seed) {
  io::TraceData d;
  d.num_experts = num_experts;
  d.top_k = top_k;
  d.num_layers = num_layers;
  d.num_sources = 8;
  d.num_count_steps = num_steps;
  SplitMix64 rng(seed);
  for (int i = 0; i < num_steps * num_layers * d.num_sources * num_experts; ++i) {
    d.counts.push_back(static_cast<int32_t>(rng.below(50)));
  }
  return d;
}

TEST(Simulator, LoadOnlyTraceRunsLoadPoliciesAndSkipsTheOthers) {
  const auto data = random_load_only_trace(16, 2, 2, 4, 3);  // outlives the source
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 8), {"static", "cobalt", "eplb"});
  options.warmup_steps = 1;
  const auto result = simulate(*source, options);
  EXPECT_TRUE(result.load_only);
  // The layout floor from the counts: static EP's single replicas fix every load; EPLB's replicas
  // leave room, and its assignment never goes below the floor.
  EXPECT_DOUBLE_EQ(result.policies[0].imbalance_floor_mean, result.policies[0].imbalance_mean);
  const auto& eplb = result.policies[2];
  EXPECT_TRUE(eplb.skipped.empty());
  EXPECT_GE(eplb.imbalance_floor_mean, 1.0);
  EXPECT_LE(eplb.imbalance_floor_mean, eplb.imbalance_mean + 1e-12);
  EXPECT_LT(eplb.imbalance_floor_mean, result.policies[0].imbalance_floor_mean);
  const auto& st = result.policies[0];
  EXPECT_TRUE(st.skipped.empty());
  EXPECT_FALSE(st.has_token_metrics);
  EXPECT_GT(st.imbalance_mean, 1.0);
  EXPECT_GT(st.time.compute_s, 0);
  EXPECT_EQ(st.time.exchange_s, 0);
  const auto& co = result.policies[1];
  EXPECT_NE(co.skipped.find("load-only"), std::string::npos) << co.skipped;
}

// Above top-k 16 cobalt and cobalt+ cannot even be built (make_policy refuses them): on a
// load-only trace they are skipped as at any top-k, and the others replay (the run failed).
TEST(Simulator, LoadOnlyTraceSkipsCobaltAboveItsTopK) {
  const auto data = random_load_only_trace(64, 20, 1, 3, 5);  // outlives the source
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 8), {"static", "cobalt", "cobalt+", "eplb"});
  options.warmup_steps = 0;
  const auto result = simulate(*source, options);
  ASSERT_EQ(result.policies.size(), 4u);
  for (int i : {1, 2}) {
    EXPECT_NE(result.policies[i].skipped.find("needs per-token expert ids"), std::string::npos)
        << result.policies[i].name << ": " << result.policies[i].skipped;
  }
  EXPECT_EQ(result.policies[1].name, "cobalt");
  EXPECT_EQ(result.policies[2].name, "cobalt+");
  EXPECT_TRUE(result.policies[0].skipped.empty());
  EXPECT_TRUE(result.policies[3].skipped.empty());
  EXPECT_GT(result.policies[3].imbalance_mean, 1.0);
}

// With asynchronous planning a plan runs while the previous step trains: when every modelled
// step lasts far longer than any plan, the wait for Cobalt's background plans costs nothing, while
// its synchronous work and the other policies' (synchronous) planning count in full. Checked as
// identities between the charged time and the policies' own counters of the same run (no timing
// assumptions).
TEST(Simulator, AsyncPlanningIsHiddenBehindTheStepItOverlaps) {
  const auto data = testing::random_trace(4, 8, 1500, 2, 32, 4, 16);
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 16), {"cobalt", "topoep"});
  options.warmup_steps = 0;             // every step measured: charged totals = counters
  options.cost.achievable_flops = 1e3;  // seconds of compute per step
  const double steps = source->num_steps();
  const auto charged_s = [&](const PolicyResult& p) { return p.time.planning_s * steps; };
  const auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 + 1e-9 * b; };
  options.policy_config.async_planning = false;
  const auto sync = simulate(*source, options);
  options.policy_config.async_planning = true;
  const auto async = simulate(*source, options);
  for (const auto* run : {&sync, &async}) {
    const auto& cobalt = run->policies[0];
    const auto& topoep = run->policies[1];
    EXPECT_GT(cobalt.counters.num_global_plans, 0);
    // Cobalt: synchronous planning in full, background plans (seconds-long steps) hidden.
    EXPECT_TRUE(near(charged_s(cobalt),
                     (cobalt.counters.planner_wall_ms - cobalt.counters.async_plan_ms) * 1e-3))
        << charged_s(cobalt) << " vs " << cobalt.counters.planner_wall_ms << " - "
        << cobalt.counters.async_plan_ms << " ms";
    // TopoEP plans synchronously every step: nothing hidden.
    EXPECT_EQ(topoep.counters.async_plan_ms, 0.0);
    EXPECT_TRUE(near(charged_s(topoep), topoep.counters.planner_wall_ms * 1e-3));
  }
  EXPECT_EQ(sync.policies[0].counters.async_plan_ms, 0.0);
}

TEST(Simulator, StepsWithoutTasksAreLeftOutOfTheBalanceMeans) {
  // Three steps of 600 tokens, the middle one made empty: imbalance and MaxVio are undefined there
  // (mean load 0), so the means cover steps 0 and 2 only and the per-step value is NaN (null).
  auto data = testing::random_trace(7, 3, 600, 2, 32, 4, 16);
  auto full_source = make_step_source(data);
  auto options = options_for(*full_source, Topology(2, 16), {"static", "cobalt"});
  options.warmup_steps = 0;
  const auto full = simulate(*full_source, options);
  // Drop step 1's tokens: offsets [0, 600, 600, 1200].
  io::TraceData gapped = data;
  const int64_t tokens = 600;
  gapped.num_tokens = 2 * tokens;
  gapped.step_offsets = {0, tokens, tokens, 2 * tokens};
  gapped.source_rank.erase(gapped.source_rank.begin() + tokens,
                           gapped.source_rank.begin() + 2 * tokens);
  gapped.topk_ids.clear();
  for (int l = 0; l < data.num_layers; ++l) {
    const auto layer = data.topk_ids.begin() + static_cast<ptrdiff_t>(l) * 3 * tokens * 4;
    gapped.topk_ids.insert(gapped.topk_ids.end(), layer, layer + tokens * 4);
    gapped.topk_ids.insert(gapped.topk_ids.end(), layer + 2 * tokens * 4, layer + 3 * tokens * 4);
  }
  auto gapped_source = make_step_source(gapped);
  const auto result = simulate(*gapped_source, options);
  const auto& st = result.policies[0];  // static: the same layout every step
  ASSERT_EQ(st.step_imbalance.size(), 3u);
  EXPECT_TRUE(std::isnan(st.step_imbalance[1]));
  EXPECT_DOUBLE_EQ(st.step_imbalance[0], full.policies[0].step_imbalance[0]);
  EXPECT_DOUBLE_EQ(st.step_imbalance[2], full.policies[0].step_imbalance[2]);
  EXPECT_NEAR(st.imbalance_mean, (st.step_imbalance[0] + st.step_imbalance[2]) / 2,
              1e-12);  // equal layer counts
  EXPECT_GT(st.imbalance_mean, 1.0);
  EXPECT_GT(st.maxvio_mean, 0.0);
  for (const auto& p : result.policies) EXPECT_TRUE(std::isnan(p.step_imbalance[1])) << p.name;
}

TEST(Simulator, RejectsBadOptions) {
  const auto data = testing::random_trace(1, 3, 100, 1, 16, 2, 4);
  auto source = make_step_source(data);
  auto options = options_for(*source, Topology(2, 4), {"static"});
  options.warmup_steps = 3;
  EXPECT_THROW(simulate(*source, options), Error);
  options.warmup_steps = 0;
  options.cost.overlap_fraction = 2;
  EXPECT_THROW(simulate(*source, options), Error);
  options.cost.overlap_fraction = 0;
  options.policies = {"no-such-policy"};
  EXPECT_THROW(simulate(*source, options), Error);
}

}  // namespace
}  // namespace cobalt::eval
