// Google Benchmark suite for the per-step hot paths. Ratios that matter are read within one run,
// e.g. BM_Assign_NodeCover bytes/s against BM_Memcpy_SameBytes (the memory-copy bound for ids in,
// ranks out).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "assign/exchange_plan_detail.hpp"
#include "bench_inputs.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/assign/exchange_plan.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "core/topk_rows_check.hpp"

namespace cobalt {
namespace {

using Workload = bench::Routing;

Workload make_workload(int64_t num_tokens, int top_k, int num_experts, int num_ranks) {
  return bench::make_routing(num_tokens, top_k, num_experts, num_ranks);
}

ExpertLayout make_layout(const Topology& topo, int num_experts, int slots) {
  std::vector<std::vector<ExpertId>> lists(topo.num_ranks());
  SplitMix64 rng(3);
  for (ExpertId e = 0; e < num_experts; ++e) lists[e % topo.num_ranks()].push_back(e);
  for (auto& l : lists) {
    while (static_cast<int>(l.size()) < slots) {
      const ExpertId e = static_cast<ExpertId>(rng.below(num_experts));
      if (std::find(l.begin(), l.end(), e) == l.end()) l.push_back(e);
    }
  }
  return ExpertLayout::from_rank_lists(topo, num_experts, slots, lists);
}

// The kernel assign_node_cover picks (kAuto: AVX-512 where the CPU has it, N <= 8, K <= 8), and
// the portable loop forced, on the same inputs: their ratio is the kernel's gain in one run.
void assign_node_cover_bench(benchmark::State& state, assign::CpuKernel kernel) {
  const int64_t num_tokens = state.range(0);
  const int top_k = static_cast<int>(state.range(1)), num_nodes = static_cast<int>(state.range(2));
  const Topology topo(num_nodes, num_nodes * 8);
  const int num_experts = 256;
  auto w = make_workload(num_tokens, top_k, num_experts, topo.num_ranks());
  auto layout = make_layout(topo, num_experts, num_experts * 3 / 2 / topo.num_ranks());
  auto batch = RoutingBatch::trusted(w.ids, w.src, top_k, num_experts, topo.num_ranks());
  std::vector<RankId> exec(batch.num_tasks());
  for (auto _ : state) {
    assign::assign_node_cover(batch, layout, {1, 0, 0, 0}, {assign::CoverSearch::kAuto, 1, kernel},
                              exec);
    benchmark::DoNotOptimize(exec.data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
  state.SetBytesProcessed(state.iterations() * num_tokens * (top_k * 8 + 4));
  const assign::CpuKernel ran =
      assign::resolve_kernel({assign::CoverSearch::kAuto, 1, kernel}, num_nodes, top_k);
  state.SetLabel(ran == assign::CpuKernel::kAvx512 ? "avx512" : "portable");
}
void BM_Assign_NodeCover(benchmark::State& state) {
  assign_node_cover_bench(state, assign::CpuKernel::kAuto);
}
void BM_Assign_NodeCover_Portable(benchmark::State& state) {
  assign_node_cover_bench(state, assign::CpuKernel::kPortable);
}
BENCHMARK(BM_Assign_NodeCover)
    ->Args({1 << 20, 8, 4})
    ->Args({1 << 20, 8, 2})
    ->Args({1 << 20, 8, 8})
    ->Args({1 << 18, 8, 16})
    ->Args({1 << 16, 8, 32})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Assign_NodeCover_Portable)
    ->Args({1 << 20, 8, 4})
    ->Args({1 << 20, 8, 2})
    ->Args({1 << 20, 8, 8})
    ->Args({1 << 18, 8, 16})
    ->Args({1 << 16, 8, 32})
    ->Unit(benchmark::kMillisecond);

// The memory-copy bound for the same bytes: read ids + sources, write ranks.
void BM_Memcpy_SameBytes(benchmark::State& state) {
  const int64_t num_tokens = state.range(0);
  const int top_k = static_cast<int>(state.range(1));
  std::vector<int32_t> in(num_tokens * (top_k + 1), 1), out(num_tokens * top_k);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), out.size() * sizeof(int32_t));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
  state.SetBytesProcessed(state.iterations() * num_tokens * (top_k * 8 + 4));
}
BENCHMARK(BM_Memcpy_SameBytes)->Args({1 << 20, 8})->Unit(benchmark::kMillisecond);

// Validating a batch (what RoutingBatch's constructor, and so every RoutingBatch made from Python,
// pays on top of its copy): the branch-free accept test (/K/0) against the plain loop (/K/1) on
// 2^20 valid tokens, E = 256; read against BM_Memcpy_SameBytes in the same run.
void BM_RoutingBatch_Validate(benchmark::State& state) {
  const int top_k = static_cast<int>(state.range(0));
  const bool reference = state.range(1) != 0;
  auto w = make_workload(1 << 20, top_k, 256, 32);
  for (auto _ : state) {
    if (reference) {
      detail::validate_topk_rows_reference(w.ids, top_k, 256, "bench");
    } else {
      validate_topk_rows(w.ids, top_k, 256, "bench");
    }
    benchmark::DoNotOptimize(w.ids.data());
  }
  state.SetItemsProcessed(state.iterations() * (1 << 20));
  state.SetLabel(reference ? "reference loop" : "branch-free");
}
BENCHMARK(BM_RoutingBatch_Validate)
    ->ArgsProduct({{2, 4, 6, 8}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// The dispatch layout of an Algorithm 1 assignment (2^20 tokens, K = 8, 4 x 8 ranks): into a fresh
// DispatchLayout every call (/0) or into one reused across calls as a runtime keeps it (/1).
// BM_Memcpy_DispatchBytes copies the bytes it must move (ranks and sources in; flags and slots
// out) for its memory-copy floor.
constexpr int64_t kDispatchTokens = 1 << 20;
constexpr int kDispatchTopK = 8;
void BM_DispatchLayout(benchmark::State& state) {
  const bool reuse = state.range(0) != 0;
  const Topology topo(4, 32);
  const int num_experts = 256;
  auto w = make_workload(kDispatchTokens, kDispatchTopK, num_experts, topo.num_ranks());
  auto layout = make_layout(topo, num_experts, num_experts * 3 / 2 / topo.num_ranks());
  auto batch = RoutingBatch::trusted(w.ids, w.src, kDispatchTopK, num_experts, topo.num_ranks());
  std::vector<RankId> exec(batch.num_tasks());
  assign::assign_node_cover(batch, layout, {1, 0, 0, 0}, {}, exec);
  assign::DispatchLayout kept;
  for (auto _ : state) {
    if (reuse) {
      assign::dispatch_layout(exec, w.src, kDispatchTopK, topo, kept);
      benchmark::DoNotOptimize(kept.slot.data());
    } else {
      const auto fresh = assign::dispatch_layout(exec, w.src, kDispatchTopK, topo);
      benchmark::DoNotOptimize(fresh.slot.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kDispatchTokens);
}
BENCHMARK(BM_DispatchLayout)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One rank's node-deduplicated exchange plan (the PyTorch runtime's, every layer and step) for a
// whole step of 4 x 8 ranks with 4096 tokens each, K = 8, E = 128, under Algorithm 1. Items:
// the step's tokens. The numpy reference took ~540 ms for the same plan (docs/performance.md).
void BM_ExchangePlan(benchmark::State& state) {
  const Topology topo(4, 32);
  const int num_experts = 128, top_k = 8;
  const int64_t per_rank = 4096, num_tokens = per_rank * topo.num_ranks();
  auto w = make_workload(num_tokens, top_k, num_experts, topo.num_ranks());
  for (int64_t t = 0; t < num_tokens; ++t) w.src[t] = static_cast<RankId>(t / per_rank);
  auto layout = make_layout(topo, num_experts, num_experts * 3 / 2 / topo.num_ranks());
  auto batch = RoutingBatch::trusted(w.ids, w.src, top_k, num_experts, topo.num_ranks());
  std::vector<RankId> exec(batch.num_tasks());
  assign::assign_node_cover(batch, layout, {1, 0, 0, 0}, {}, exec);
  const RankId rank = 5;
  // /1: rank masks (what exchange_plan runs for G <= 64); /0: the insertion-sort path.
  const bool use_rank_masks = state.range(0) != 0;
  for (auto _ : state) {
    const auto plan = assign::detail::exchange_plan_impl(
        w.ids, exec, w.src, top_k, topo, layout.slots_of(rank), rank, use_rank_masks);
    benchmark::DoNotOptimize(plan.table_idx.data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
}
BENCHMARK(BM_ExchangePlan)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_Memcpy_DispatchBytes(benchmark::State& state) {
  const int num_ranks = 32;
  const int64_t in_bytes = kDispatchTokens * (kDispatchTopK + 1) * 4,
                out_bytes = kDispatchTokens * (num_ranks + kDispatchTopK * 4);
  std::vector<char> in(std::max(in_bytes, out_bytes), 1), out(out_bytes);
  for (auto _ : state) {
    // Read every input byte, write every output byte (the output is the larger here).
    std::memcpy(out.data(), in.data(), out_bytes);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kDispatchTokens);
}
BENCHMARK(BM_Memcpy_DispatchBytes)->Unit(benchmark::kMillisecond);

// count_routing (the fast path) or count_routing_reference (the definition: every ordered pair,
// one thread) on the same inputs: their ratio in one run is the fast path's gain.
void count_routing_bench(benchmark::State& state, bool reference) {
  const int64_t num_tokens = state.range(0);
  const int num_experts = static_cast<int>(state.range(1));
  auto w = make_workload(num_tokens, 8, num_experts, 32);
  auto batch = RoutingBatch::trusted(w.ids, w.src, 8, num_experts, 32);
  std::vector<int64_t> loads(num_experts), coact(static_cast<size_t>(num_experts) * num_experts);
  for (auto _ : state) {
    if (reference) {
      count_routing_reference(batch, loads, coact);
    } else {
      count_routing(batch, loads, coact, 1);
    }
    benchmark::DoNotOptimize(coact.data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
}
void BM_Stats_CountRouting(benchmark::State& state) { count_routing_bench(state, false); }
void BM_Stats_CountRouting_Reference(benchmark::State& state) { count_routing_bench(state, true); }
BENCHMARK(BM_Stats_CountRouting)
    ->Args({1 << 20, 128})
    ->Args({1 << 20, 1024})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Stats_CountRouting_Reference)
    ->Args({1 << 20, 128})
    ->Args({1 << 20, 1024})
    ->Unit(benchmark::kMillisecond);

// What a Cobalt policy pays per step and layer for its statistics: counts plus the EMA update.
void BM_Stats_Update(benchmark::State& state) {
  const int64_t num_tokens = state.range(0);
  const int num_experts = static_cast<int>(state.range(1));
  auto w = make_workload(num_tokens, 8, num_experts, 32);
  auto batch = RoutingBatch::trusted(w.ids, w.src, 8, num_experts, 32);
  RoutingStats stats(num_experts, 0.9);
  for (auto _ : state) {
    stats.update(batch, 1);
    benchmark::DoNotOptimize(stats.coactivation().data());
  }
  state.SetItemsProcessed(state.iterations() * num_tokens);
}
BENCHMARK(BM_Stats_Update)
    ->Args({1 << 18, 128})
    ->Args({1 << 18, 1024})
    ->Unit(benchmark::kMillisecond);

void BM_GlobalPlan_Heuristic(benchmark::State& state) {
  const int num_experts = static_cast<int>(state.range(0)),
            num_nodes = static_cast<int>(state.range(1));
  const Topology topo(num_nodes, num_nodes * 8);
  auto w = make_workload(1 << 16, 8, num_experts, topo.num_ranks());
  RoutingStats stats = RoutingStats::exact_counts(num_experts);
  stats.update(RoutingBatch::trusted(w.ids, w.src, 8, num_experts, topo.num_ranks()));
  plan::GlobalPlanInput input{
      topo, num_experts,         slots_for_rho(num_experts, topo.num_ranks(), 0.5),
      0.15, stats.expert_load(), stats.coactivation()};
  for (auto _ : state) {
    auto result = plan::plan_global_heuristic(input, {1, 0, true, 50});
    benchmark::DoNotOptimize(result.objective);
  }
}
BENCHMARK(BM_GlobalPlan_Heuristic)
    ->Args({64, 2})
    ->Args({256, 8})
    ->Args({1024, 64})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cobalt
