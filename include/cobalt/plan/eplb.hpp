// DeepSeek-EPLB (github.com/deepseek-ai/EPLB, eplb.py): a C++ port of rebalance_experts and its
// helpers, with the same inputs, outputs and semantics.
//
// rebalance_experts(weight [L, E], R replicas, groups, nodes, gpus):
//   - hierarchical policy when groups % nodes == 0: pack expert groups onto nodes (balanced
//     packing), replicate hot experts inside each node, pack each node's physical experts onto its
//     GPUs;
//   - global policy otherwise: the same with one group and one node (replicate over all experts,
//     pack onto all GPUs).
//   Physical expert p lives on GPU p / (R / gpus).
//
// Arithmetic and tie rule (so outputs equal eplb.py's bit for bit):
//   - weights are converted to float32 (eplb.py: weight.float()); group sums, pack weights and
//     per-replica loads (w / count) are float32, accumulated left to right;
//   - sorting by load uses torch.sort(descending=True)'s CPU algorithm, which is not stable:
//     std::sort (libstdc++ introsort) of (value, index) pairs with "greater". Calling the same
//     algorithm gives the same order for equal loads (and equal loads are the rule, not the
//     exception: all replicas of one expert carry the same load). Checked against eplb.py under
//     torch 1.13 on 600 random inputs, half of them full of exact ties: identical phy2log,
//     log2phy and logcnt. A build against another standard library (libc++) orders ties
//     differently;
//   - replicate_experts picks the *first* (lowest index) maximum of w / count, as
//     torch.max(dim).indices does;
//   - balanced_packing puts each item on the lightest pack that still has room, the lowest pack
//     index among equally light ones, as Python's min(..., key=...) does.
//   Float32 group sums can differ from torch's vectorised reduction in the last bit for
//   non-integer loads; integer loads below 2^24 are exact either way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cobalt::plan {

struct EplbResult {
  int num_layers = 0;
  int num_experts = 0;            // logical experts E
  int num_replicas = 0;           // physical experts R
  int max_replicas = 0;           // X = max over layers and experts of logcnt
  std::vector<int32_t> phy2log;   // [L, R]: logical expert of each physical expert
  std::vector<int32_t> phy_rank;  // [L, R]: replica index of each physical expert (0 = first)
  std::vector<int32_t> log2phy;   // [L, E, X]: physical ids of each expert's replicas, -1 pad
  std::vector<int32_t> logcnt;    // [L, E]: replicas per logical expert

  int32_t phy2log_at(int layer, int phy) const {
    return phy2log[static_cast<size_t>(layer) * num_replicas + phy];
  }
  int32_t logcnt_at(int layer, int expert) const {
    return logcnt[static_cast<size_t>(layer) * num_experts + expert];
  }
  int32_t log2phy_at(int layer, int expert, int replica) const {
    return log2phy[(static_cast<size_t>(layer) * num_experts + expert) * max_replicas + replica];
  }
};

// weight: [num_layers, num_experts] row-major loads (finite, >= 0). Throws cobalt::Error
// (kInvalidArgument) with a one-line message when a size is not positive, num_replicas %
// num_gpus != 0, num_gpus % num_nodes != 0, num_replicas < num_experts, (hierarchical)
// num_experts % num_groups != 0, a weight is negative or not finite, or weight.size() differs
// from num_layers * num_experts.
EplbResult rebalance_experts(std::span<const double> weight, int num_layers, int num_experts,
                             int num_replicas, int num_groups, int num_nodes, int num_gpus);

// The helpers, exposed for tests (same contracts as eplb.py; float32 rows).
struct PackResult {
  std::vector<int32_t> pack_index;    // [X, n]
  std::vector<int32_t> rank_in_pack;  // [X, n]
};
// weight: [num_rows, n], n % num_packs == 0; each pack receives exactly n / num_packs items.
PackResult balanced_packing(std::span<const float> weight, int num_rows, int n, int num_packs);

struct ReplicateResult {
  std::vector<int32_t> phy2log;  // [X, num_phy]
  std::vector<int32_t> rank;     // [X, num_phy]
  std::vector<int32_t> logcnt;   // [X, num_log]
};
// weight: [num_rows, num_log], num_phy >= num_log: adds num_phy - num_log replicas, each to the
// expert with the largest per-replica load.
ReplicateResult replicate_experts(std::span<const float> weight, int num_rows, int num_log,
                                  int num_phy);

}  // namespace cobalt::plan
