// Port of DeepSeek-EPLB's eplb.py (see the header for the arithmetic and tie rules).
#include "cobalt/plan/eplb.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"

namespace cobalt::plan {
namespace {

// Row-wise inverse of permutations: inv[row, perm[row, i]] = i. perm: [num_rows, n].
std::vector<int32_t> inverse(const std::vector<int32_t>& perm, int num_rows, int n) {
  std::vector<int32_t> inv(perm.size());
  for (int row = 0; row < num_rows; ++row) {
    const size_t base = static_cast<size_t>(row) * n;
    for (int i = 0; i < n; ++i) inv[base + perm[base + i]] = i;
  }
  return inv;
}

// eplb.py rebalance_experts_hierarchical on float32 weights [L, E]: returns phy2log, phy_rank
// [L, R] and logcnt [L, E].
struct Hierarchical {
  std::vector<int32_t> phy2log, phy_rank, logcnt;
};

Hierarchical rebalance_hierarchical(const std::vector<float>& weight, int num_layers,
                                    int num_experts, int num_replicas, int num_groups,
                                    int num_nodes, int num_gpus) {
  const int group_size = num_experts / num_groups;
  const int groups_per_node = num_groups / num_nodes;
  const int phy_per_gpu = num_replicas / num_gpus;
  const int log_per_node = num_experts / num_nodes;
  const int phy_per_node = num_replicas / num_nodes;
  const int num_rows = num_layers * num_nodes;  // one row per (layer, node)

  // Step 1: pack groups onto nodes.
  std::vector<float> tokens_per_group(static_cast<size_t>(num_layers) * num_groups);
  for (int l = 0; l < num_layers; ++l) {
    for (int g = 0; g < num_groups; ++g) {
      float sum = 0.0f;
      for (int k = 0; k < group_size; ++k) {
        sum += weight[static_cast<size_t>(l) * num_experts + g * group_size + k];
      }
      tokens_per_group[static_cast<size_t>(l) * num_groups + g] = sum;
    }
  }
  const PackResult group_pack =
      balanced_packing(tokens_per_group, num_layers, num_groups, num_nodes);
  // log2mlog [L, E]: logical expert -> "meta-logical" index (node-major order).
  std::vector<int32_t> log2mlog(static_cast<size_t>(num_layers) * num_experts);
  for (int l = 0; l < num_layers; ++l) {
    for (int g = 0; g < num_groups; ++g) {
      const size_t gi = static_cast<size_t>(l) * num_groups + g;
      const int base =
          (group_pack.pack_index[gi] * groups_per_node + group_pack.rank_in_pack[gi]) * group_size;
      for (int k = 0; k < group_size; ++k) {
        log2mlog[static_cast<size_t>(l) * num_experts + g * group_size + k] = base + k;
      }
    }
  }
  const std::vector<int32_t> mlog2log = inverse(log2mlog, num_layers, num_experts);

  // Step 2: replicate experts within each node. tokens_per_mlog: [L * nodes, E / nodes].
  std::vector<float> tokens_per_mlog(static_cast<size_t>(num_layers) * num_experts);
  for (int l = 0; l < num_layers; ++l) {
    for (int m = 0; m < num_experts; ++m) {
      const size_t i = static_cast<size_t>(l) * num_experts + m;
      tokens_per_mlog[i] = weight[static_cast<size_t>(l) * num_experts + mlog2log[i]];
    }
  }
  const ReplicateResult rep =
      replicate_experts(tokens_per_mlog, num_rows, log_per_node, phy_per_node);

  // Step 3: pack each node's physical experts onto its GPUs by per-replica load.
  std::vector<float> tokens_per_phy(static_cast<size_t>(num_rows) * phy_per_node);
  for (int row = 0; row < num_rows; ++row) {
    for (int p = 0; p < phy_per_node; ++p) {
      const size_t pi = static_cast<size_t>(row) * phy_per_node + p;
      const size_t mi = static_cast<size_t>(row) * log_per_node + rep.phy2log[pi];
      tokens_per_phy[pi] = tokens_per_mlog[mi] / static_cast<float>(rep.logcnt[mi]);
    }
  }
  const PackResult phy_pack =
      balanced_packing(tokens_per_phy, num_rows, phy_per_node, num_gpus / num_nodes);
  std::vector<int32_t> phy2pphy(phy_pack.pack_index.size());
  for (size_t i = 0; i < phy2pphy.size(); ++i) {
    phy2pphy[i] = phy_pack.pack_index[i] * phy_per_gpu + phy_pack.rank_in_pack[i];
  }
  const std::vector<int32_t> pphy2phy = inverse(phy2pphy, num_rows, phy_per_node);

  Hierarchical out;
  out.phy2log.resize(static_cast<size_t>(num_layers) * num_replicas);
  out.phy_rank.resize(out.phy2log.size());
  for (int l = 0; l < num_layers; ++l) {
    for (int n = 0; n < num_nodes; ++n) {
      const int row = l * num_nodes + n;
      for (int q = 0; q < phy_per_node; ++q) {
        const size_t src = static_cast<size_t>(row) * phy_per_node +
                           pphy2phy[static_cast<size_t>(row) * phy_per_node + q];
        const int mlog = rep.phy2log[src] + n * log_per_node;
        const size_t dst = static_cast<size_t>(l) * num_replicas + n * phy_per_node + q;
        out.phy2log[dst] = mlog2log[static_cast<size_t>(l) * num_experts + mlog];
        out.phy_rank[dst] = rep.rank[src];
      }
    }
  }
  // logcnt [L, E] = mlogcnt viewed as [L, E] (node-major), gathered by log2mlog.
  out.logcnt.resize(static_cast<size_t>(num_layers) * num_experts);
  for (int l = 0; l < num_layers; ++l) {
    for (int e = 0; e < num_experts; ++e) {
      const size_t i = static_cast<size_t>(l) * num_experts + e;
      const int mlog = log2mlog[i];
      out.logcnt[i] =
          rep.logcnt[static_cast<size_t>(l * num_nodes + mlog / log_per_node) * log_per_node +
                     mlog % log_per_node];
    }
  }
  return out;
}

}  // namespace

PackResult balanced_packing(std::span<const float> weight, int num_rows, int n, int num_packs) {
  COBALT_CHECK_ARG(num_rows >= 0 && n >= 1 && num_packs >= 1 && n % num_packs == 0,
                   "eplb balanced_packing: {} items cannot be split evenly over {} packs", n,
                   num_packs);
  COBALT_CHECK_ARG(weight.size() == static_cast<size_t>(num_rows) * n,
                   "eplb balanced_packing: weight has {} values, expected {} x {}", weight.size(),
                   num_rows, n);
  const int per_pack = n / num_packs;
  PackResult out;
  out.pack_index.assign(static_cast<size_t>(num_rows) * n, -1);
  out.rank_in_pack.assign(out.pack_index.size(), -1);
  if (per_pack == 1) {
    for (int row = 0; row < num_rows; ++row) {
      for (int i = 0; i < n; ++i) {
        out.pack_index[static_cast<size_t>(row) * n + i] = i;
        out.rank_in_pack[static_cast<size_t>(row) * n + i] = 0;
      }
    }
    return out;
  }
  std::vector<int32_t> order(n);
  std::vector<float> pack_weight(num_packs);
  std::vector<int> pack_items(num_packs);
  for (int row = 0; row < num_rows; ++row) {
    const float* w = weight.data() + static_cast<size_t>(row) * n;
    // torch.sort(descending=True) on the CPU: std::sort (introsort) of (value, index) pairs with
    // "greater" — not stable. The same call on the same standard library (libstdc++) breaks ties
    // identically.
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [w](int32_t a, int32_t b) { return w[a] > w[b]; });
    std::fill(pack_weight.begin(), pack_weight.end(), 0.0f);
    std::fill(pack_items.begin(), pack_items.end(), 0);
    for (int32_t item : order) {
      int best = -1;
      for (int p = 0; p < num_packs; ++p) {
        if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
      }
      out.pack_index[static_cast<size_t>(row) * n + item] = best;
      out.rank_in_pack[static_cast<size_t>(row) * n + item] = pack_items[best];
      pack_weight[best] += w[item];
      pack_items[best] += 1;
    }
  }
  return out;
}

ReplicateResult replicate_experts(std::span<const float> weight, int num_rows, int num_log,
                                  int num_phy) {
  COBALT_CHECK_ARG(num_rows >= 0 && num_log >= 1 && num_phy >= num_log,
                   "eplb replicate_experts: {} physical experts cannot hold {} logical ones",
                   num_phy, num_log);
  COBALT_CHECK_ARG(weight.size() == static_cast<size_t>(num_rows) * num_log,
                   "eplb replicate_experts: weight has {} values, expected {} x {}", weight.size(),
                   num_rows, num_log);
  ReplicateResult out;
  out.phy2log.resize(static_cast<size_t>(num_rows) * num_phy);
  out.rank.assign(out.phy2log.size(), 0);
  out.logcnt.assign(static_cast<size_t>(num_rows) * num_log, 1);
  // Max-heap on (w / count, then lowest index): its top is torch.max(dim).indices of w / count.
  struct Key {
    float load;
    int32_t expert;
  };
  auto lower = [](const Key& a, const Key& b) {
    return a.load < b.load || (a.load == b.load && a.expert > b.expert);
  };
  std::vector<Key> heap;
  for (int row = 0; row < num_rows; ++row) {
    const float* w = weight.data() + static_cast<size_t>(row) * num_log;
    int32_t* phy2log = out.phy2log.data() + static_cast<size_t>(row) * num_phy;
    int32_t* rank = out.rank.data() + static_cast<size_t>(row) * num_phy;
    int32_t* logcnt = out.logcnt.data() + static_cast<size_t>(row) * num_log;
    std::iota(phy2log, phy2log + num_log, 0);
    heap.clear();
    for (int e = 0; e < num_log; ++e) heap.push_back({w[e], e});
    std::make_heap(heap.begin(), heap.end(), lower);
    for (int p = num_log; p < num_phy; ++p) {
      std::pop_heap(heap.begin(), heap.end(), lower);
      const int32_t e = heap.back().expert;
      phy2log[p] = e;
      rank[p] = logcnt[e];
      logcnt[e] += 1;
      heap.back() = {w[e] / static_cast<float>(logcnt[e]), e};
      std::push_heap(heap.begin(), heap.end(), lower);
    }
  }
  return out;
}

EplbResult rebalance_experts(std::span<const double> weight, int num_layers, int num_experts,
                             int num_replicas, int num_groups, int num_nodes, int num_gpus) {
  COBALT_CHECK_ARG(num_layers >= 1 && num_experts >= 1,
                   "eplb: weight must have at least one layer and one expert (got {} x {})",
                   num_layers, num_experts);
  COBALT_CHECK_ARG(weight.size() == static_cast<size_t>(num_layers) * num_experts,
                   "eplb: weight has {} values, expected {} layers x {} experts", weight.size(),
                   num_layers, num_experts);
  COBALT_CHECK_ARG(num_replicas >= 1 && num_groups >= 1 && num_nodes >= 1 && num_gpus >= 1,
                   "eplb: replicas ({}), groups ({}), nodes ({}) and gpus ({}) must be >= 1",
                   num_replicas, num_groups, num_nodes, num_gpus);
  COBALT_CHECK_ARG(num_gpus % num_nodes == 0, "eplb: gpus ({}) must be a multiple of nodes ({})",
                   num_gpus, num_nodes);
  COBALT_CHECK_ARG(num_replicas % num_gpus == 0,
                   "eplb: replicas ({}) must be a multiple of gpus ({})", num_replicas, num_gpus);
  COBALT_CHECK_ARG(num_replicas >= num_experts,
                   "eplb: replicas ({}) must be >= the number of experts ({})", num_replicas,
                   num_experts);
  const bool hierarchical = num_groups % num_nodes == 0;
  if (hierarchical) {
    COBALT_CHECK_ARG(num_experts % num_groups == 0,
                     "eplb: experts ({}) must be a multiple of groups ({}) for the hierarchical "
                     "policy",
                     num_experts, num_groups);
  }
  std::vector<float> w(weight.size());
  for (size_t i = 0; i < weight.size(); ++i) {
    // eplb.py works in float32: a double above FLT_MAX would become inf there.
    w[i] = static_cast<float>(weight[i]);
    COBALT_CHECK_ARG(std::isfinite(w[i]) && weight[i] >= 0,
                     "eplb: weight[{}][{}] = {} must be finite in float32 and >= 0 (range [0, {}])",
                     i / num_experts, i % num_experts, weight[i],
                     std::numeric_limits<float>::max());
  }
  const Hierarchical h =
      hierarchical
          ? rebalance_hierarchical(w, num_layers, num_experts, num_replicas, num_groups, num_nodes,
                                   num_gpus)
          : rebalance_hierarchical(w, num_layers, num_experts, num_replicas, 1, 1, num_gpus);
  EplbResult out;
  out.num_layers = num_layers;
  out.num_experts = num_experts;
  out.num_replicas = num_replicas;
  out.max_replicas = *std::max_element(h.logcnt.begin(), h.logcnt.end());
  out.phy2log = h.phy2log;
  out.phy_rank = h.phy_rank;
  out.logcnt = h.logcnt;
  // log2phy is [L, E, max_replicas]: with many replicas of one expert it outgrows everything else
  // (the number is known only now). Refused with a one-line error rather than left to the OOM
  // killer; the assignment above is unchanged.
  require_memory(4.0 * num_layers * num_experts * out.max_replicas,
                 fmt::format("eplb: log2phy of {} layers x {} experts x {} replicas of the most "
                             "replicated expert",
                             num_layers, num_experts, out.max_replicas),
                 "fewer replicas (or layers)");
  out.log2phy.assign(static_cast<size_t>(num_layers) * num_experts * out.max_replicas, -1);
  for (int l = 0; l < num_layers; ++l) {
    for (int p = 0; p < num_replicas; ++p) {
      const size_t i = static_cast<size_t>(l) * num_replicas + p;
      out.log2phy[(static_cast<size_t>(l) * num_experts + h.phy2log[i]) * out.max_replicas +
                  h.phy_rank[i]] = p;
    }
  }
  return out;
}

}  // namespace cobalt::plan
