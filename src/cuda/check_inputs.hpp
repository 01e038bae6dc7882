// Inputs for cobalt_gpu_check and the host emulation test: random batches and layouts, real
// traces, synthetic workload presets, and TopoEP demand matrices. Host code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/synthetic.hpp"

namespace cobalt::cuda::check {

struct Batch {
  std::string name;
  std::vector<int32_t> ids;  // [T, K]
  std::vector<int32_t> src;  // [T]
  int top_k = 0;
  int num_experts = 0;
  int num_ranks = 0;
  int64_t num_tokens() const { return static_cast<int64_t>(src.size()); }
  RoutingBatch view() const {
    return RoutingBatch::trusted(ids, src, top_k, num_experts, num_ranks);
  }
};

// T tokens of K distinct experts; skew s > 0 favours low ids (u^(1+s)); sources contiguous blocks
// (data parallelism) when contiguous, else uniform.
inline Batch random_batch(uint64_t seed, int64_t num_tokens, int top_k, int num_experts,
                          int num_ranks, double skew, bool contiguous = true) {
  Batch b;
  b.name = "random";
  b.top_k = top_k;
  b.num_experts = num_experts;
  b.num_ranks = num_ranks;
  b.ids.resize(static_cast<size_t>(num_tokens) * top_k);
  b.src.resize(static_cast<size_t>(num_tokens));
  SplitMix64 rng(seed);
  for (int64_t t = 0; t < num_tokens; ++t) {
    int32_t* row = b.ids.data() + t * top_k;
    for (int k = 0; k < top_k;) {
      double u = rng.unit();
      if (skew > 0) u = std::pow(u, 1.0 + skew);
      const int32_t e = std::min(num_experts - 1, static_cast<int32_t>(u * num_experts));
      if (std::find(row, row + k, e) == row + k) row[k++] = e;
    }
    b.src[t] = contiguous ? static_cast<int32_t>(t * num_ranks / num_tokens)
                          : static_cast<int32_t>(rng.below(num_ranks));
  }
  return b;
}

// Every expert once at a random rank with room, then random extra replicas while slots remain
// (probability `fill` per extra slot).
inline ExpertLayout random_layout(uint64_t seed, const Topology& topo, int num_experts,
                                  int slots_per_rank, double fill) {
  SplitMix64 rng(seed);
  const int num_ranks = topo.num_ranks();
  std::vector<std::vector<ExpertId>> lists(num_ranks);
  std::vector<ExpertId> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  for (int i = num_experts - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  for (ExpertId e : order) {
    for (;;) {
      const RankId r = static_cast<RankId>(rng.below(num_ranks));
      if (static_cast<int>(lists[r].size()) < slots_per_rank) {
        lists[r].push_back(e);
        break;
      }
    }
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    for (int tries = 0;
         static_cast<int>(lists[r].size()) < slots_per_rank && tries < 4 * slots_per_rank;
         ++tries) {
      if (rng.unit() >= fill) continue;
      const ExpertId e = static_cast<ExpertId>(rng.below(num_experts));
      if (std::find(lists[r].begin(), lists[r].end(), e) == lists[r].end()) lists[r].push_back(e);
    }
  }
  return ExpertLayout::from_rank_lists(topo, num_experts, slots_per_rank, lists);
}

// Layer `layer` of a real trace, tiled to at least `min_tokens` tokens (0: as is), sources
// contiguous over `num_ranks` ranks. Tiling repeats the recorded rows, so the skew and
// co-activation of the real routing are kept.
inline Batch trace_batch(const std::string& path, int layer, int num_ranks, int64_t min_tokens) {
  io::TraceReader reader(path);
  std::vector<ExpertId> scratch;
  const auto ids = reader.topk_ids(layer, 0, reader.num_tokens(), scratch);
  Batch b;
  const auto slash = path.find_last_of('/');
  b.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  b.name = b.name.substr(0, b.name.find('_')) + "-l" + std::to_string(layer);
  b.top_k = reader.top_k();
  b.num_experts = reader.num_experts();
  b.num_ranks = num_ranks;
  const int64_t recorded = reader.num_tokens();
  const int64_t copies = min_tokens > recorded ? (min_tokens + recorded - 1) / recorded : 1;
  b.ids.reserve(static_cast<size_t>(recorded * copies) * b.top_k);
  for (int64_t c = 0; c < copies; ++c) b.ids.insert(b.ids.end(), ids.begin(), ids.end());
  const int64_t num_tokens = recorded * copies;
  b.src.resize(static_cast<size_t>(num_tokens));
  for (int64_t t = 0; t < num_tokens; ++t) {
    b.src[t] = static_cast<int32_t>(t * num_ranks / num_tokens);
  }
  return b;
}

// One step of a synthetic workload preset (e.g. "realistic", "paper-topoep-640x8").
inline Batch preset_batch(const std::string& preset, int64_t num_tokens, int num_ranks,
                          uint64_t seed) {
  workload::PresetOverrides over;
  over.num_steps = 1;
  over.num_layers = 1;
  over.tokens_per_step = num_tokens;
  over.num_sources = num_ranks;
  over.seed = seed;
  const auto spec = workload::workload_preset(preset, over);
  workload::GenerateOptions options;
  options.num_threads = 0;
  auto data = workload::generate_trace(spec, options);
  Batch b;
  b.name = preset;
  b.top_k = data.top_k;
  b.num_experts = data.num_experts;
  b.num_ranks = num_ranks;
  b.ids = std::move(data.topk_ids);
  b.src.assign(data.source_rank.begin(), data.source_rank.end());
  return b;
}

// Omega [G, E]: tasks from rank s choosing expert e.
inline std::vector<int64_t> demand_of(const Batch& b) {
  std::vector<int64_t> omega(static_cast<size_t>(b.num_ranks) * b.num_experts, 0);
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    for (int k = 0; k < b.top_k; ++k) {
      omega[static_cast<size_t>(b.src[t]) * b.num_experts + b.ids[t * b.top_k + k]] += 1;
    }
  }
  return omega;
}

}  // namespace cobalt::cuda::check
