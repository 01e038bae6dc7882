// Random inputs for property tests: routing batches and valid layouts from a seed.
#pragma once

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/io/trace.hpp"

namespace cobalt::testing {

struct OwnedBatch {
  std::vector<ExpertId> topk_ids;   // [T, K]
  std::vector<RankId> source_rank;  // [T]
  int top_k = 0;
  int num_experts = 0;
  int num_ranks = 0;
  RoutingBatch view() const {
    return RoutingBatch(topk_ids, source_rank, top_k, num_experts, num_ranks);
  }
};

// The `count` tokens of `b` from `first` on (a micro-batch of b).
inline OwnedBatch token_range(const OwnedBatch& b, int64_t first, int64_t count) {
  OwnedBatch part = b;
  part.topk_ids.assign(b.topk_ids.begin() + first * b.top_k,
                       b.topk_ids.begin() + (first + count) * b.top_k);
  part.source_rank.assign(b.source_rank.begin() + first, b.source_rank.begin() + first + count);
  return part;
}

// T tokens, K distinct experts each, skewed towards low ids when skew > 0.
inline OwnedBatch random_batch(uint64_t seed, int64_t num_tokens, int top_k, int num_experts,
                               int num_ranks, double skew = 0.0) {
  SplitMix64 rng(seed);
  OwnedBatch b;
  b.top_k = top_k;
  b.num_experts = num_experts;
  b.num_ranks = num_ranks;
  b.topk_ids.reserve(num_tokens * top_k);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<ExpertId> row;
    while (static_cast<int>(row.size()) < top_k) {
      double u = rng.unit();
      for (int i = 0; i < skew; ++i) u *= rng.unit();
      const ExpertId e = static_cast<ExpertId>(u * num_experts);
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    b.topk_ids.insert(b.topk_ids.end(), row.begin(), row.end());
    b.source_rank.push_back(static_cast<RankId>(rng.below(num_ranks)));
  }
  return b;
}

// A valid layout: every expert once at a random rank with free slots, then random extra replicas.
inline ExpertLayout random_layout(uint64_t seed, const Topology& topo, int num_experts,
                                  int slots_per_rank, double fill = 0.7) {
  SplitMix64 rng(seed);
  const int num_ranks = topo.num_ranks();
  // Every expert needs a slot (the placement below would loop for ever otherwise).
  if (num_experts > num_ranks * slots_per_rank) {
    throw std::invalid_argument("random_layout: " + std::to_string(num_experts) + " experts for " +
                                std::to_string(num_ranks * slots_per_rank) + " slots");
  }
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
    while (static_cast<int>(lists[r].size()) < slots_per_rank && rng.unit() < fill) {
      const ExpertId e = static_cast<ExpertId>(rng.below(num_experts));
      if (std::find(lists[r].begin(), lists[r].end(), e) == lists[r].end())
        lists[r].push_back(e);
      else
        break;
    }
  }
  return ExpertLayout::from_rank_lists(topo, num_experts, slots_per_rank, lists);
}

// A multi-step, multi-layer in-memory trace: `steps` steps of `tokens` tokens, skewed routing,
// source ranks in [0, sources).
inline io::TraceData random_trace(uint64_t seed, int steps, int64_t tokens, int layers, int experts,
                                  int top_k, int sources) {
  io::TraceData data;
  data.num_experts = experts;
  data.top_k = top_k;
  data.num_layers = layers;
  data.num_tokens = steps * tokens;
  for (int l = 0; l < layers; ++l) {
    auto b = random_batch(seed * 31 + l, data.num_tokens, top_k, experts, sources, 1.5);
    data.topk_ids.insert(data.topk_ids.end(), b.topk_ids.begin(), b.topk_ids.end());
    if (l == 0) data.source_rank = b.source_rank;
  }
  data.num_sources = sources;
  for (int s = 0; s <= steps; ++s) data.step_offsets.push_back(s * tokens);
  return data;
}

// A token trace of `layers` x `tokens` rows of top_k ids, id_of(i, k) for row i (layer-major, as
// TraceData stores them), no source ranks and no step boundaries (set step_offsets after).
template <class IdOf>
io::TraceData id_trace(int experts, int top_k, int layers, int64_t tokens, IdOf&& id_of) {
  io::TraceData d;
  d.num_experts = experts;
  d.top_k = top_k;
  d.num_layers = layers;
  d.num_tokens = tokens;
  for (int64_t i = 0; i < layers * tokens; ++i) {
    for (int k = 0; k < top_k; ++k) d.topk_ids.push_back(static_cast<ExpertId>(id_of(i, k)));
  }
  return d;
}

// A load-only trace (counts [S, 1, R, E], no token ids): deterministic counts in [0, 11).
inline io::TraceData load_only_trace(int steps, int sources, int experts, int top_k) {
  io::TraceData d;
  d.num_experts = experts;
  d.top_k = top_k;
  d.num_layers = 1;
  d.num_sources = sources;
  d.num_count_steps = steps;
  for (int i = 0; i < steps * sources * experts; ++i) d.counts.push_back((i * 37) % 11);
  return d;
}

}  // namespace cobalt::testing
