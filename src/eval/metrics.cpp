#include "cobalt/eval/metrics.hpp"

#include <algorithm>
#include <bit>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::eval {

CrossNodeTransfers cross_node_transfers(const RoutingBatch& batch,
                                        std::span<const RankId> exec_rank,
                                        const Topology& topology) {
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k();
  const int per_node = topology.ranks_per_node();
  CrossNodeTransfers result;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const NodeId src_node = batch.source_of(t) / per_node;
    uint64_t nodes = 0;
    const RankId* row = exec_rank.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      const NodeId n = row[k] / per_node;
      nodes |= uint64_t{1} << n;
      result.no_dedup += n != src_node;
    }
    nodes &= ~(uint64_t{1} << src_node);
    result.dedup += std::popcount(nodes);
  }
  return result;
}

std::vector<int64_t> rank_loads(std::span<const RankId> exec_rank, int num_ranks) {
  std::vector<int64_t> loads(num_ranks, 0);
  for (RankId r : exec_rank) {
    COBALT_CHECK_ARG(r >= 0 && r < num_ranks, "metrics: execution rank {} out of range [0, {})", r,
                     num_ranks);
    ++loads[r];
  }
  return loads;
}

double imbalance(std::span<const int64_t> loads) {
  if (loads.empty()) return 1.0;
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
  if (total == 0) return 1.0;
  const int64_t max_load = *std::max_element(loads.begin(), loads.end());
  return static_cast<double>(max_load) * static_cast<double>(loads.size()) /
         static_cast<double>(total);
}

double max_violation(std::span<const int64_t> expert_counts) {
  return imbalance(expert_counts) - 1.0;
}

StepMetrics step_metrics(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                         const Topology& topology) {
  StepMetrics m;
  m.transfers = cross_node_transfers(batch, exec_rank, topology);
  m.rank_loads = rank_loads(exec_rank, topology.num_ranks());
  m.imbalance = imbalance(m.rank_loads);
  std::vector<int64_t> expert_counts(batch.num_experts(), 0);
  for (ExpertId e : batch.topk_ids()) ++expert_counts[e];
  m.max_violation = max_violation(expert_counts);
  return m;
}

ExchangeVolume exchange_volume(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                               const Topology& topology) {
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k(), per_node = topology.ranks_per_node();
  const int num_ranks = topology.num_ranks(), num_nodes = topology.num_nodes();
  ExchangeVolume v;
  v.node_out.assign(num_nodes, 0);
  v.node_in.assign(num_nodes, 0);
  v.nvlink_out.assign(num_ranks, 0);
  v.nvlink_in.assign(num_ranks, 0);
  // Last token that reached each rank / node: dedups a token's copies without sorting.
  std::vector<TokenIdx> rank_seen(num_ranks, -1), node_seen(num_nodes, -1);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const RankId src = batch.source_of(t);
    const NodeId src_node = src / per_node;
    const int src_local = src - src_node * per_node;
    const RankId* row = exec_rank.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      const RankId d = row[k];
      COBALT_CHECK_ARG(d >= 0 && d < num_ranks, "metrics: execution rank {} out of range [0, {})",
                       d, num_ranks);
      if (rank_seen[d] == t) continue;
      rank_seen[d] = t;
      const NodeId n = d / per_node;
      // Within the source node the token goes straight from its rank; elsewhere it lands on the
      // relay rank with the source's local index (one inter-node copy per node).
      RankId entry = src;
      if (n != src_node) {
        entry = n * per_node + src_local;
        if (node_seen[n] != t) {
          node_seen[n] = t;
          ++v.node_out[src_node];
          ++v.node_in[n];
        }
      }
      if (d != entry) {
        ++v.nvlink_out[entry];
        ++v.nvlink_in[d];
      }
    }
  }
  return v;
}

}  // namespace cobalt::eval
