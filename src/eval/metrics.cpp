#include "cobalt/eval/metrics.hpp"

#include <algorithm>
#include <bit>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::eval {
namespace {

// Node of every rank [G] (a table: integer division by a runtime divisor is slow per task).
std::vector<NodeId> node_of_ranks(const Topology& topology) {
  std::vector<NodeId> node_of(topology.num_ranks());
  for (RankId r = 0; r < topology.num_ranks(); ++r) node_of[r] = topology.node_of(r);
  return node_of;
}

// Source ranks index the topology's rank tables: the batch must not name more ranks.
void check_sources_fit(const RoutingBatch& batch, const Topology& topology) {
  COBALT_CHECK_ARG(batch.num_ranks() <= topology.num_ranks(),
                   "metrics: the batch has source ranks in [0, {}), the topology {} ranks",
                   batch.num_ranks(), topology.num_ranks());
}

}  // namespace

CrossNodeTransfers cross_node_transfers(const RoutingBatch& batch,
                                        std::span<const RankId> exec_rank,
                                        const Topology& topology) {
  check_sources_fit(batch, topology);
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k();
  const std::vector<NodeId> node_of = node_of_ranks(topology);
  const auto num_ranks = static_cast<uint32_t>(topology.num_ranks());
  CrossNodeTransfers result;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const NodeId src_node = node_of[batch.source_of(t)];
    uint64_t nodes = 0;
    const RankId* row = exec_rank.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      COBALT_CHECK_ARG(static_cast<uint32_t>(row[k]) < num_ranks,
                       "metrics: execution rank {} out of range [0, {})", row[k], num_ranks);
      const NodeId n = node_of[row[k]];
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
  check_sources_fit(batch, topology);
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k(), per_node = topology.ranks_per_node();
  const int num_ranks = topology.num_ranks(), num_nodes = topology.num_nodes();
  const std::vector<NodeId> node_of = node_of_ranks(topology);
  ExchangeVolume v;
  v.node_out.assign(num_nodes, 0);
  v.node_in.assign(num_nodes, 0);
  v.nvlink_out.assign(num_ranks, 0);
  v.nvlink_in.assign(num_ranks, 0);
  // Last token that reached each rank / node: dedups a token's copies without sorting.
  std::vector<TokenIdx> rank_seen_buf(num_ranks, -1), node_seen_buf(num_nodes, -1);
  // Raw pointers keep the hot loop free of reloads through the vectors.
  TokenIdx* rank_seen = rank_seen_buf.data();
  TokenIdx* node_seen = node_seen_buf.data();
  int64_t* node_out = v.node_out.data();
  int64_t* node_in = v.node_in.data();
  int64_t* nvlink_out = v.nvlink_out.data();
  int64_t* nvlink_in = v.nvlink_in.data();
  const NodeId* node_of_rank = node_of.data();
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const RankId src = batch.source_of(t);
    const NodeId src_node = node_of_rank[src];
    const int src_local = src - src_node * per_node;
    const RankId* row = exec_rank.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      const RankId d = row[k];
      COBALT_CHECK_ARG(static_cast<uint32_t>(d) < static_cast<uint32_t>(num_ranks),
                       "metrics: execution rank {} out of range [0, {})", d, num_ranks);
      if (rank_seen[d] == t) continue;
      rank_seen[d] = t;
      const NodeId n = node_of_rank[d];
      // Within the source node the token goes straight from its rank; elsewhere it lands on the
      // relay rank with the source's local index (one inter-node copy per node).
      RankId entry = src;
      if (n != src_node) {
        entry = n * per_node + src_local;
        if (node_seen[n] != t) {
          node_seen[n] = t;
          ++node_out[src_node];
          ++node_in[n];
        }
      }
      if (d != entry) {
        ++nvlink_out[entry];
        ++nvlink_in[d];
      }
    }
  }
  return v;
}

}  // namespace cobalt::eval
