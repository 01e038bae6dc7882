// Planner speed of the reproduced peers, one call per iteration on one core:
//   BM_TopoEP_Solve/E/G      TopoEP's per-microbatch solver (DESIGN.md target: E=640, G=128 in
//                            <= 1 ms), on a hot-block routing matrix (4096 tokens per rank, top-8,
//                            8 ranks per node, 2 extra slots per rank);
//   BM_TopoEP_Solve_WideNode/E/G/N  the same with wide NVLink domains (4 x 72, 1 x 256 ranks);
//   BM_UltraEP_Solve/E/G     UltraEP's quota placement on the same matrices;
//   BM_EPLB_Rebalance/E/R/G  DeepSeek-EPLB rebalance_experts for one layer (hierarchical policy
//                            with E/8 groups over G/8 nodes: DeepSeek-V3's 256 experts + 32
//                            redundant on 32 GPUs, and larger).
#include <benchmark/benchmark.h>

#include <vector>

#include "cobalt/core/rng.hpp"
#include "cobalt/plan/eplb.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "cobalt/plan/ultraep_solver.hpp"

namespace cobalt {
namespace {

constexpr int kTopK = 8;
constexpr int64_t kTokensPerRank = 4096;
constexpr int kRanksPerNode = 8;

// Omega [G, E]: each token picks K distinct experts, the experts of the first rank 12x as likely
// as the others (static-EP rank imbalance ~8.5 at E=640, G=32).
std::vector<int64_t> hot_block_demand(int num_experts, int num_ranks) {
  SplitMix64 rng(17);
  const int hot = (num_experts + num_ranks - 1) / num_ranks;
  const double hot_weight = 12.0, total = hot * hot_weight + (num_experts - hot);
  std::vector<int64_t> demand(static_cast<size_t>(num_ranks) * num_experts, 0);
  for (int r = 0; r < num_ranks; ++r) {
    for (int64_t t = 0; t < kTokensPerRank; ++t) {
      int picked[kTopK];
      for (int n = 0; n < kTopK;) {
        const double u = rng.unit() * total;
        int e = u < hot * hot_weight ? static_cast<int>(u / hot_weight)
                                     : hot + static_cast<int>(u - hot * hot_weight);
        if (e >= num_experts) e = num_experts - 1;
        bool dup = false;
        for (int i = 0; i < n; ++i) dup = dup || picked[i] == e;
        if (!dup) picked[n++] = e;
      }
      for (int e : picked) demand[static_cast<size_t>(r) * num_experts + e] += 1;
    }
  }
  return demand;
}

// One solver call per iteration on the hot-block Omega of E experts over G ranks in N nodes.
void run_topoep(benchmark::State& state, int num_experts, int num_ranks, int num_nodes) {
  const auto demand = hot_block_demand(num_experts, num_ranks);
  const int slots = (num_experts + num_ranks - 1) / num_ranks + 2;
  plan::TopoEpInput input{
      Topology(num_nodes, num_ranks), num_experts, slots, 8192.0, 3.46e7, demand};
  plan::TopoEpSolver solver;
  plan::TopoEpPlan plan;
  for (auto _ : state) {
    solver.solve(input, plan);
    benchmark::DoNotOptimize(plan.rank_loads.data());
  }
  state.counters["inter_replicas"] = static_cast<double>(plan.stats.num_inter_node_replicas);
  state.counters["moves"] = static_cast<double>(plan.stats.num_refinement_moves);
}

void BM_TopoEP_Solve(benchmark::State& state) {
  const auto num_ranks = static_cast<int>(state.range(1));
  run_topoep(state, static_cast<int>(state.range(0)), num_ranks, num_ranks / kRanksPerNode);
}
BENCHMARK(BM_TopoEP_Solve)
    ->Args({640, 32})
    ->Args({640, 128})
    ->Args({1024, 128})
    ->Unit(benchmark::kMicrosecond);

// The same with wide NVLink domains: 4 nodes of 72 ranks (NVL72), one node of 256 ranks.
void BM_TopoEP_Solve_WideNode(benchmark::State& state) {
  run_topoep(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
             static_cast<int>(state.range(2)));
}
BENCHMARK(BM_TopoEP_Solve_WideNode)
    ->Args({640, 288, 4})
    ->Args({512, 256, 1})
    ->Unit(benchmark::kMicrosecond);

void BM_UltraEP_Solve(benchmark::State& state) {
  const int num_experts = static_cast<int>(state.range(0));
  const int num_ranks = static_cast<int>(state.range(1));
  const auto demand = hot_block_demand(num_experts, num_ranks);
  plan::UltraEpInput input;
  input.topology = Topology(num_ranks / kRanksPerNode, num_ranks);
  input.num_experts = num_experts;
  input.slots_per_rank = (num_experts + num_ranks - 1) / num_ranks + 2;
  input.demand = demand;
  input.options.min_tokens_per_replica = kTokensPerRank * kTopK / 64;
  for (auto _ : state) {
    auto plan = plan::solve_ultraep(input);
    benchmark::DoNotOptimize(plan.rank_loads.data());
  }
}
BENCHMARK(BM_UltraEP_Solve)->Args({640, 32})->Args({640, 128})->Unit(benchmark::kMicrosecond);

void BM_EPLB_Rebalance(benchmark::State& state) {
  const int num_experts = static_cast<int>(state.range(0));
  const int num_replicas = static_cast<int>(state.range(1));
  const int num_gpus = static_cast<int>(state.range(2));
  SplitMix64 rng(5);
  std::vector<double> weight(num_experts);
  for (auto& w : weight) w = static_cast<double>(rng.below(10000));
  for (auto _ : state) {
    auto r = plan::rebalance_experts(weight, 1, num_experts, num_replicas, num_experts / 8,
                                     num_gpus / kRanksPerNode, num_gpus);
    benchmark::DoNotOptimize(r.phy2log.data());
  }
}
BENCHMARK(BM_EPLB_Rebalance)
    ->Args({256, 288, 32})
    ->Args({256, 320, 64})
    ->Args({640, 704, 32})
    ->Args({1024, 1280, 128})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cobalt
