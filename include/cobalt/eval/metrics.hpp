// Metrics of DESIGN.md §3.3. These definitions are contracts: reports, dumps and tests all use
// them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::eval {

struct CrossNodeTransfers {
  // V = sum_t |{node(exec(t,e)) : e in D_t} \ {node(src_t)}|  (node-level dedup, DeepEP style)
  int64_t dedup = 0;
  // sum over tasks of [node(exec) != node(src)]  (no dedup)
  int64_t no_dedup = 0;
};

// exec_rank: [T, K] aligned with batch.topk_ids().
CrossNodeTransfers cross_node_transfers(const RoutingBatch& batch,
                                        std::span<const RankId> exec_rank,
                                        const Topology& topology);

// L_r = number of tasks executed on rank r: [G].
std::vector<int64_t> rank_loads(std::span<const RankId> exec_rank, int num_ranks);

// max_r L_r / mean_r L_r; 1.0 when there are no tasks. kInvalidArgument for a negative load or
// loads that sum past 2^63 - 1.
double imbalance(std::span<const int64_t> loads);

// Expert-level MaxVio = max_e c_e / mean(c) - 1 over expert task counts c [E]; 0 when there are
// none. The same errors as imbalance.
double max_violation(std::span<const int64_t> expert_counts);

// Bytes of `token_copies` token copies of `hidden` elements of `bytes_per_element` each (all >= 0:
// kInvalidArgument otherwise).
inline double token_bytes(int64_t token_copies, int hidden, int bytes_per_element) {
  COBALT_CHECK_ARG(token_copies >= 0 && hidden >= 0 && bytes_per_element >= 0,
                   "token bytes: copies {}, hidden {}, bytes per element {} must be >= 0",
                   token_copies, hidden, bytes_per_element);
  return static_cast<double>(token_copies) * hidden * bytes_per_element;
}

// The balance floor of a layout: the lowest maximum rank load any assignment of expert_counts
// [E] (tasks per expert) can reach when every task runs on a rank holding its expert, whatever
// that costs in cross-node transfers. Exact (a binary search on the bound, each bound checked by
// a max flow from experts to the ranks holding them). 0 when there are no tasks. Throws
// kInvalidArgument when the sizes disagree or a count is negative.
int64_t min_max_rank_load(std::span<const int64_t> expert_counts, const ExpertLayout& layout);

// min_max_rank_load / mean rank load: the lowest imbalance any assignment reaches on the layout
// (1.0 when there are no tasks). A policy's imbalance above it comes from its assignment; up to
// it, from its layout.
double imbalance_floor(std::span<const int64_t> expert_counts, const ExpertLayout& layout);

// The whole-task bound of a (step, layer) with num_tasks tasks on num_ranks ranks: loads are whole
// tasks, so under every layout and every assignment the busiest rank carries at least
// ceil(num_tasks / G) of them, and no imbalance is below ceil(num_tasks / G) / (num_tasks / G)
// (1.0 without tasks). It matters on small steps: a decode step of 25 tokens with K = 4 puts 100
// tasks on 32 ranks, which nothing balances below 4 / 3.125 = 1.28. imbalance_floor is never
// below it. Throws kInvalidArgument when num_tasks < 0 or num_ranks < 1.
double whole_task_imbalance_bound(int64_t num_tasks, int num_ranks);

// Everything about one (step, layer) of one policy.
struct StepMetrics {
  CrossNodeTransfers transfers;
  std::vector<int64_t> rank_loads;     // [G]
  std::vector<int64_t> expert_counts;  // [E] tasks per expert
  double imbalance = 1.0;
  double max_violation = 0.0;
};
StepMetrics step_metrics(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                         const Topology& topology);

// Token copies one dispatch moves over each link (the input of the cost model, DESIGN.md §5),
// DeepEP style. For token t from source rank s on node n_s, let D_t be the distinct execution ranks
// of its K tasks (a rank receives a token once, however many of its experts it runs):
//   * inter-node: one copy n_s -> m for every node m != n_s holding a rank of D_t (node dedup,
//     so sum(node_out) == sum(node_in) == cross_node_transfers(...).dedup);
//   * intra-node, source node: one NVLink copy s -> d for every d in D_t on n_s with d != s;
//   * intra-node, remote node m: the copy lands on the relay rank p = m * M + (s mod M) (the GPU
//     with s's local index, as RDMA does) and p forwards one NVLink copy to every d in D_t on m
//     with d != p.
// The combine sends the same copies back (out and in swap); backward repeats both, so one volume
// describes all four exchanges.
struct ExchangeVolume {
  std::vector<int64_t> node_out, node_in;      // [N] copies over the inter-node fabric
  std::vector<int64_t> nvlink_out, nvlink_in;  // [G] copies over NVLink
};
// exec_rank: [T, K] aligned with batch.topk_ids(); every rank in [0, G).
ExchangeVolume exchange_volume(const RoutingBatch& batch, std::span<const RankId> exec_rank,
                               const Topology& topology);

// A layer-step's replay as the simulator scores it: validate_assignment (the same kInternal error
// for a task on a rank lacking its expert), then step_metrics and exchange_volume, equal to those
// calls' results; up to 64 ranks in one pass over the assignment instead of five.
struct LayerReplay {
  StepMetrics metrics;
  ExchangeVolume volume;
};
LayerReplay replay_layer(const RoutingBatch& batch, const ExpertLayout& layout,
                         std::span<const RankId> exec_rank, const Topology& topology);

}  // namespace cobalt::eval
