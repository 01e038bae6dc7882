// Benchmarks of whole per-step work: thread scaling of the assignment, the balanced assignment,
// stage-2 rebalancing, cobalt+'s stage-2b swaps, the default Cobalt planning call, and one
// simulated step of every policy.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_inputs.hpp"
#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/floor_swaps.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/intra_node_rebalance.hpp"
#include "cobalt/plan/rank_matching.hpp"
#include "cobalt/policy/policy.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt {
namespace {

using bench::make_routing;
using bench::Routing;

// A planned layout for E experts on `topo` from one batch's statistics.
ExpertLayout planned_layout(const Topology& topo, int num_experts, const Routing& w, int top_k) {
  RoutingStats stats = RoutingStats::exact_counts(num_experts);
  stats.update(RoutingBatch::trusted(w.ids, w.src, top_k, num_experts, topo.num_ranks()));
  plan::GlobalPlanInput input{
      topo, num_experts,         slots_for_rho(num_experts, topo.num_ranks(), 0.5),
      0.15, stats.expert_load(), stats.coactivation()};
  auto result = plan::plan_global_heuristic(input, {1, 0, true, 50});
  return plan::pack_ranks(input, result.plan, nullptr, nullptr);
}

void BM_Assign_NodeCover_Threads(benchmark::State& state) {
  const Topology topo(4, 32);
  const int num_experts = 256, top_k = 8;
  const int64_t num_tokens = 1 << 21;
  auto w = make_routing(num_tokens, top_k, num_experts, topo.num_ranks(), 1);
  auto layout = planned_layout(topo, num_experts, w, top_k);
  auto batch = RoutingBatch::trusted(w.ids, w.src, top_k, num_experts, topo.num_ranks());
  std::vector<RankId> exec(batch.num_tasks());
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    assign::assign_node_cover(batch, layout, {1, 0, 0, 0}, {assign::CoverSearch::kAuto, threads},
                              exec);
    benchmark::DoNotOptimize(exec.data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
}
BENCHMARK(BM_Assign_NodeCover_Threads)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// cobalt+'s balanced assignment of one batch (E experts, top-8, skewed routing of `seed`) on a
// layout planned from it. Args: threads (the result is the same for any), spill (1: cobalt+'s
// 0.05, 0: none). keep_workspace: scratch kept across calls as cobalt+ keeps it (else allocated
// per call).
void run_balanced_cover(benchmark::State& state, const Topology& topo, int num_experts,
                        int64_t num_tokens, uint64_t seed, bool keep_workspace) {
  const int top_k = 8;
  auto w = make_routing(num_tokens, top_k, num_experts, topo.num_ranks(), seed);
  auto layout = planned_layout(topo, num_experts, w, top_k);
  auto batch = RoutingBatch::trusted(w.ids, w.src, top_k, num_experts, topo.num_ranks());
  std::vector<RankId> exec(batch.num_tasks());
  const int num_threads = static_cast<int>(state.range(0));
  const double spill_tolerance = state.range(1) ? 0.05 : -1.0;
  assign::BalancedCoverWorkspace workspace;
  for (auto _ : state) {
    assign::assign_balanced_cover(batch, layout, {}, {assign::CoverSearch::kAuto, num_threads},
                                  exec, spill_tolerance, keep_workspace ? &workspace : nullptr);
    benchmark::DoNotOptimize(exec.data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
}

// 4 nodes x 8 ranks, E = 256, 2^20 tokens (the per-chunk key tables). Third arg: workspace (1:
// kept, 0: allocated per call).
void BM_Assign_BalancedCover(benchmark::State& state) {
  run_balanced_cover(state, Topology(4, 32), 256, int64_t{1} << 20, 2, state.range(2) != 0);
}
BENCHMARK(BM_Assign_BalancedCover)
    ->Args({1, 1, 1})
    ->Args({2, 1, 1})
    ->Args({1, 0, 1})
    ->Args({2, 0, 1})
    ->Args({1, 1, 0})
    ->Args({1, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// More than 8 nodes (the hashed class index instead of the key tables): 16 nodes x 8 ranks,
// E = 512, 2^19 tokens; workspace kept.
void BM_Assign_BalancedCover_16Nodes(benchmark::State& state) {
  run_balanced_cover(state, Topology(16, 128), 512, int64_t{1} << 19, 5, true);
}
BENCHMARK(BM_Assign_BalancedCover_16Nodes)
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Rebalance_IntraNode(benchmark::State& state) {
  const Topology topo(8, 64);
  const int num_experts = 256;
  auto w = make_routing(1 << 16, 8, num_experts, topo.num_ranks(), 3);
  auto layout = planned_layout(topo, num_experts, w, 8);
  SplitMix64 rng(4);
  std::vector<double> loads(layout.slots().size());
  for (size_t i = 0; i < loads.size(); ++i)
    loads[i] = layout.slots()[i] < 0 ? 0.0 : 100 * rng.unit();
  for (auto _ : state) {
    auto r = plan::rebalance_intra_node(layout, loads);
    benchmark::DoNotOptimize(r.num_moves);
  }
}
BENCHMARK(BM_Rebalance_IntraNode)->Unit(benchmark::kMicrosecond);

// Stage 2b's input on 4 nodes x 8 ranks: a layout planned for one 2^16-token batch of E experts
// (rho 0.5), that batch's tasks per expert (counts [E]) and unit removal costs [N, E].
struct FloorSwapInput {
  ExpertLayout layout;
  std::vector<int64_t> counts;
  std::vector<double> removal_cost;
};

FloorSwapInput floor_swap_input(int num_experts) {
  const Topology topo(4, 32);
  auto w = make_routing(1 << 16, 8, num_experts, topo.num_ranks(), 3);
  std::vector<int64_t> counts(num_experts, 0);
  for (ExpertId e : w.ids) ++counts[e];
  return {planned_layout(topo, num_experts, w, 8), std::move(counts),
          std::vector<double>(static_cast<size_t>(topo.num_nodes()) * num_experts, 1.0)};
}

// cobalt+'s stage 2b for one layer and step (at most one swap, 64 candidate checks): the layout
// planned for one batch, with the loads of that batch (arg 0: typically within the cap, so one
// floor computation) or with the expert ids reversed (arg 1: the hot set moved since the plan, so
// the tight set, the candidates and their max flows).
void BM_FloorSwaps(benchmark::State& state) {
  const auto [layout, counts, removal_cost] = [&] {
    auto input = floor_swap_input(256);
    if (state.range(0)) std::reverse(input.counts.begin(), input.counts.end());
    return input;
  }();
  size_t num_swaps = 0;
  for (auto _ : state) {
    auto r = plan::swap_toward_floor(layout, counts, removal_cost, {0.05, 1, 64});
    num_swaps = r.swaps.size();
    benchmark::DoNotOptimize(r.floor_after);
  }
  state.SetLabel(num_swaps ? "1 swap" : "no swap");
}
BENCHMARK(BM_FloorSwaps)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// Stage 2b with cobalt+'s limits (20 swaps, 1024 candidates and 256 exchanges per swap) on a
// layout with cobalt+'s tight slots (E = 64 on 32 ranks, rho 0.5: 3 slots per rank, as OLMoE 4x8)
// planned for one batch, and the counts of that batch with three pairs of experts' counts traded
// (seed 242: the first seed, scanning from 1, whose trade leaves a floor that a group of swaps,
// plan/floor_swaps.hpp step 5, lowers). Arg: 0 without groups, 3 with groups of up to 3
// (cobalt+'s setting). The label says how far each gets, and "(a group)" when one was made.
bool has_group(const plan::FloorSwapResult& result) {
  int64_t floor = result.floor_before;
  for (const auto& swap : result.swaps) {
    if (swap.floor_after == floor) return true;  // a group's earlier swap keeps the floor
    floor = swap.floor_after;
  }
  return false;
}

void BM_FloorSwaps_Groups(benchmark::State& state) {
  const int num_experts = 64;
  const auto [layout, counts, removal_cost] = [&] {
    auto input = floor_swap_input(num_experts);
    SplitMix64 rng(242);
    for (int i = 0; i < 3; ++i) {
      std::swap(input.counts[rng.below(num_experts)], input.counts[rng.below(num_experts)]);
    }
    return input;
  }();
  const plan::FloorSwapOptions options{0.05, 20, 1024, 256, static_cast<int>(state.range(0))};
  plan::FloorSwapResult result{layout, {}, 0, 0};
  for (auto _ : state) {
    result = plan::swap_toward_floor(layout, counts, removal_cost, options);
    benchmark::DoNotOptimize(result.floor_after);
  }
  state.SetLabel(std::to_string(result.swaps.size()) + " swaps, floor " +
                 std::to_string(result.floor_before) + " -> " + std::to_string(result.floor_after) +
                 (has_group(result) ? " (a group)" : ""));
}
BENCHMARK(BM_FloorSwaps_Groups)->Arg(0)->Arg(3)->Unit(benchmark::kMicrosecond);

// The exact group-to-rank matching of one node (Hungarian, O(M^3)) that pack_ranks and stage 2
// run per node: M = 8 (an HGX node) and 72 (a rack-scale NVLink domain).
void BM_RankMatching(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  SplitMix64 rng(6);
  std::vector<int64_t> weight(static_cast<size_t>(n) * n);
  for (auto& w : weight) w = static_cast<int64_t>(rng.below(8)) * (n + 1) + rng.below(2);
  for (auto _ : state) {
    auto perm = plan::max_weight_perfect_matching(weight, n);
    benchmark::DoNotOptimize(perm.data());
  }
}
BENCHMARK(BM_RankMatching)->Arg(8)->Arg(72)->Unit(benchmark::kMicrosecond);

// The `cobalt` policy's planning call: 8 restarts + the incremental one, on 1 or 2 threads.
void BM_GlobalPlan_CobaltDefault(benchmark::State& state) {
  const Topology topo(8, 64);
  const int num_experts = 256;
  auto w = make_routing(1 << 16, 8, num_experts, topo.num_ranks(), 5);
  RoutingStats stats = RoutingStats::exact_counts(num_experts);
  stats.update(RoutingBatch::trusted(w.ids, w.src, 8, num_experts, topo.num_ranks()));
  plan::GlobalPlanInput input{
      topo, num_experts,         slots_for_rho(num_experts, topo.num_ranks(), 0.5),
      0.15, stats.expert_load(), stats.coactivation()};
  // The incremental restart starts from the layout in force: static EP at the first plan.
  const ExpertLayout in_force =
      ExpertLayout::static_ep(topo, num_experts, slots_for_rho(num_experts, topo.num_ranks(), 0.5));
  const plan::NodePlan current = plan::node_plan_of(in_force, stats.expert_load());
  plan::HeuristicOptions options{8, 0, true, 50};
  options.num_threads = static_cast<int>(state.range(0));
  options.initial = &current;
  for (auto _ : state) {
    auto result = plan::plan_global_heuristic(input, options);
    benchmark::DoNotOptimize(result.objective);
  }
}
BENCHMARK(BM_GlobalPlan_CobaltDefault)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One step (after 11 warm-up steps, so Cobalt has planned) of every policy: E=128, 4x8, 2^16
// tokens.
void BM_Policy_Step(benchmark::State& state, std::string name) {
  policy::PolicyConfig config;
  config.topology = Topology(4, 32);
  config.num_experts = 128;
  config.top_k = 8;
  config.slots_per_rank = slots_for_rho(128, 32, 0.5);
  auto pol = policy::make_policy(name, config);
  std::vector<Routing> steps;
  for (int s = 0; s < 12; ++s) steps.push_back(make_routing(1 << 16, 8, 128, 32, 10 + s));
  std::vector<RankId> exec(steps[0].ids.size());
  for (int s = 0; s < 11; ++s) {
    pol->run(s, 0, RoutingBatch::trusted(steps[s].ids, steps[s].src, 8, 128, 32), exec);
  }
  int64_t step = 11;
  for (auto _ : state) {
    const auto& w = steps[step % 12];
    pol->run(step++, 0, RoutingBatch::trusted(w.ids, w.src, 8, 128, 32), exec);
    benchmark::DoNotOptimize(exec.data());
  }
  state.SetItemsProcessed(state.iterations() * (int64_t{1} << 16));
}

const bool kRegistered = [] {
  for (const auto& name : policy::policy_names()) {
    benchmark::RegisterBenchmark(("BM_Policy_Step/" + name).c_str(), BM_Policy_Step, name)
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace cobalt
