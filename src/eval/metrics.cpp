#include "cobalt/eval/metrics.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>

#include "cobalt/core/assignment.hpp"
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
  COBALT_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxRanks,
                   "metrics: number of ranks {} out of range [1, {}]", num_ranks, kMaxRanks);
  std::vector<int64_t> loads(num_ranks, 0);
  for (RankId r : exec_rank) {
    COBALT_CHECK_ARG(r >= 0 && r < num_ranks, "metrics: execution rank {} out of range [0, {})", r,
                     num_ranks);
    ++loads[r];
  }
  return loads;
}

namespace {

// max / mean of counts that must be >= 0 and sum below 2^63 (`what` and `entry` name them in the
// error).
double max_over_mean(std::span<const int64_t> counts, const char* what, const char* entry) {
  int64_t total = 0, max_count = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t count = counts[i];
    COBALT_CHECK_ARG(count >= 0, "{}: {} {} has {} tasks, must be >= 0", what, entry, i, count);
    COBALT_CHECK_ARG(count <= std::numeric_limits<int64_t>::max() - total,
                     "{}: the {}s' tasks sum past 2^63 - 1 (at {} {})", what, entry, entry, i);
    total += count;
    max_count = std::max(max_count, count);
  }
  if (total == 0) return 1.0;
  return static_cast<double>(max_count) * static_cast<double>(counts.size()) /
         static_cast<double>(total);
}

}  // namespace

double imbalance(std::span<const int64_t> loads) {
  return max_over_mean(loads, "imbalance", "rank");
}

double max_violation(std::span<const int64_t> expert_counts) {
  return max_over_mean(expert_counts, "max violation", "expert") - 1.0;
}

StepMetrics step_metrics(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                         const Topology& topology) {
  StepMetrics m;
  m.transfers = cross_node_transfers(batch, exec_rank, topology);
  m.rank_loads = rank_loads(exec_rank, topology.num_ranks());
  m.imbalance = imbalance(m.rank_loads);
  m.expert_counts.assign(batch.num_experts(), 0);
  for (ExpertId e : batch.topk_ids()) ++m.expert_counts[e];
  m.max_violation = max_violation(m.expert_counts);
  return m;
}

namespace {

// exchange_volume up to 64 ranks, one token at a time from its destination ranks as a bit mask:
// per node it reaches, the copies there as mask algebra (the relay rank's bit removed, popcounts
// for the senders), and one pass over the bits of the NVLink receivers. Up to 8 nodes the node
// loop has a fixed trip count (no data-dependent branch).
class MaskExchange {
 public:
  explicit MaskExchange(const Topology& topology)
      : per_node_(topology.ranks_per_node()),
        num_nodes_(topology.num_nodes()),
        node_of_(node_of_ranks(topology)),
        node_ranks_(topology.num_nodes(), 0) {
    for (RankId r = 0; r < topology.num_ranks(); ++r) node_ranks_[node_of_[r]] |= uint64_t{1} << r;
  }

  NodeId node_of(RankId r) const { return node_of_[r]; }

  // Adds the copies of one token from `src` to the ranks in `ranks` (G <= 64) to v; returns the
  // number of remote nodes it reaches (its cross-node transfers, node-deduplicated).
  int64_t add(RankId src, uint64_t ranks, ExchangeVolume& v) const {
    const NodeId src_node = node_of_[src];
    const int src_local = src - src_node * per_node_;
    // Source node: straight from s to every other destination rank there.
    uint64_t receivers = ranks & node_ranks_[src_node] & ~(uint64_t{1} << src);
    v.nvlink_out[src] += std::popcount(receivers);
    // Remote nodes: one inter-node copy each, to the relay rank with s's local index, which
    // forwards to the node's other destination ranks.
    const uint64_t remote = ranks & ~node_ranks_[src_node];
    int64_t remote_nodes = 0;
    const auto reach = [&](NodeId n, uint64_t on_node, int64_t reached) {
      const RankId relay = n * per_node_ + src_local;
      const uint64_t forwarded = on_node & ~(uint64_t{1} << relay);
      v.node_in[n] += reached;
      remote_nodes += reached;
      v.nvlink_out[relay] += std::popcount(forwarded);
      receivers |= forwarded;
    };
    if (num_nodes_ <= 8) {
      for (NodeId n = 0; n < num_nodes_; ++n) {
        const uint64_t on_node = remote & node_ranks_[n];
        reach(n, on_node, on_node != 0);
      }
    } else {
      for (uint64_t rest = remote; rest;) {
        const NodeId n = node_of_[std::countr_zero(rest)];
        const uint64_t on_node = rest & node_ranks_[n];
        rest &= ~on_node;
        reach(n, on_node, 1);
      }
    }
    v.node_out[src_node] += remote_nodes;
    for (; receivers; receivers &= receivers - 1) ++v.nvlink_in[std::countr_zero(receivers)];
    return remote_nodes;
  }

 private:
  int per_node_, num_nodes_;
  std::vector<NodeId> node_of_;       // [G]
  std::vector<uint64_t> node_ranks_;  // [N] the node's ranks as bits
};

void exchange_volume_masks(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                           const Topology& topology, ExchangeVolume& v) {
  const int top_k = batch.top_k(), num_ranks = topology.num_ranks();
  const MaskExchange exchange(topology);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const RankId* row = exec_rank.data() + t * top_k;
    uint64_t ranks = 0;
    uint32_t bad = 0;
    for (int k = 0; k < top_k; ++k) {
      const uint32_t d = static_cast<uint32_t>(row[k]);
      bad |= d >= static_cast<uint32_t>(num_ranks);
      ranks |= uint64_t{1} << (d & 63);
    }
    if (bad) {
      for (int k = 0; k < top_k; ++k) {
        COBALT_CHECK_ARG(row[k] >= 0 && row[k] < num_ranks,
                         "metrics: execution rank {} out of range [0, {})", row[k], num_ranks);
      }
    }
    exchange.add(batch.source_of(t), ranks, v);
  }
}

ExchangeVolume empty_volume(const Topology& topology) {
  ExchangeVolume v;
  v.node_out.assign(topology.num_nodes(), 0);
  v.node_in.assign(topology.num_nodes(), 0);
  v.nvlink_out.assign(topology.num_ranks(), 0);
  v.nvlink_in.assign(topology.num_ranks(), 0);
  return v;
}

}  // namespace

LayerReplay replay_layer(const RoutingBatch& batch, const ExpertLayout& layout,
                         std::span<const RankId> exec_rank, const Topology& topology) {
  COBALT_CHECK_ARG(layout.topology() == topology,
                   "metrics: the layout is for {}, the replay for {}",
                   layout.topology().to_string(), topology.to_string());
  const int num_ranks = topology.num_ranks();
  if (num_ranks > 64 || batch.num_experts() != layout.num_experts()) {
    validate_assignment(batch, layout, exec_rank);
    return {step_metrics(batch, exec_rank, topology), exchange_volume(batch, exec_rank, topology)};
  }
  check_sources_fit(batch, topology);
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k();
  const MaskExchange exchange(topology);
  LayerReplay out{StepMetrics{}, empty_volume(topology)};
  StepMetrics& m = out.metrics;
  m.rank_loads.assign(num_ranks, 0);
  m.expert_counts.assign(batch.num_experts(), 0);
  int64_t* expert_counts = m.expert_counts.data();
  const ExpertId* ids = batch.topk_ids().data();
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const RankId src = batch.source_of(t);
    const NodeId src_node = exchange.node_of(src);
    const RankId* row = exec_rank.data() + t * top_k;
    const ExpertId* experts = ids + t * top_k;
    uint64_t ranks = 0;
    bool held = true;
    for (int k = 0; k < top_k; ++k) {
      const auto d = static_cast<uint32_t>(row[k]);
      const bool in_range = d < static_cast<uint32_t>(num_ranks);
      const RankId safe = in_range ? static_cast<RankId>(d) : 0;  // indexes only when valid
      held &= in_range & layout.holds(safe, experts[k]);
      ranks |= uint64_t{1} << safe;
      ++m.rank_loads[safe];
      ++expert_counts[experts[k]];
      m.transfers.no_dedup += exchange.node_of(safe) != src_node;
    }
    // A task on a rank lacking its expert: validate_assignment names the first one.
    if (!held) validate_assignment(batch, layout, exec_rank);
    m.transfers.dedup += exchange.add(src, ranks, out.volume);
  }
  m.imbalance = imbalance(m.rank_loads);
  m.max_violation = max_violation(m.expert_counts);
  return out;
}

ExchangeVolume exchange_volume(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                               const Topology& topology) {
  check_sources_fit(batch, topology);
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "metrics: {} execution ranks for {} tasks", exec_rank.size(), batch.num_tasks());
  const int top_k = batch.top_k(), per_node = topology.ranks_per_node();
  const int num_ranks = topology.num_ranks(), num_nodes = topology.num_nodes();
  ExchangeVolume v = empty_volume(topology);
  if (num_ranks <= 64) {
    exchange_volume_masks(batch, exec_rank, topology, v);
    return v;
  }
  const std::vector<NodeId> node_of = node_of_ranks(topology);
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
