// LAER-MoE's re-layout planner (Liu et al., ASPLOS'26; PKU-DAIR/Hetu-Galvatron branch laer-moe,
// csrc/greedy_balancer.cpp `greedy_load_balancing_heuristic_complete`), run every step on the
// demand of recent steps.
//
// 1. Replica counts: candidates are the load-proportional counts of replica_counts.hpp (node_step
//    = N, so experts spread over nodes first; every slot is spent) and, when G*S is a multiple of
//    E, the uniform count G*S/E; plus optional random perturbations of both (move one increment
//    between two experts).
// 2. Placement of each candidate (get_greedy_placement): all replicas, each carrying w_e / r_e,
//    sorted by that load descending (ties: lower expert id); each goes to the least loaded rank
//    with a free slot (ties: lowest rank) among those on the nodes where the expert has the fewest
//    replicas so far (node spreading); if no such rank has a free slot, to the least loaded rank
//    with a free slot anywhere.
// 3. Choice: the candidate with the smallest modelled time
//      4 * sum_src comm(src) + (3 + [global_checkpoint]) * max_r comp(r)
//    where the demand is routed same-node first with even splits (replica_routing.hpp,
//    kSameNodeFirst), comm(src) = sum_dst flow * token_bytes / bw(src, dst) (bw: free on the same
//    rank, NVLink within a node, the per-GPU network share across nodes) and comp(r) = tasks on r
//    * compute time per token.
//
// Simplifications (named; docs/peers.md): no rank holds two replicas of one expert (the original
// may stack two on one device; here such a replica goes to another rank, or is dropped when every
// rank with a free slot already holds the expert); counts are capped at G; perturbations use the
// SplitMix64 stream of `seed` instead of mt19937(2333); the hardware constants come from
// PeerCostParams instead of LAER's profiled JSON files.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/plan/peer_cost.hpp"

namespace cobalt::plan {

struct LaerOptions {
  PeerCostParams cost;
  bool global_checkpoint = true;  // recomputation adds a fourth compute pass (LAER's default)
  int num_perturbations = 0;      // LAER's solver passes 0 in its current code
  uint64_t seed = 0;
};

// Step 2 for given replica counts [E] and expert loads [E].
ExpertLayout laer_spread_placement(const Topology& topology, int num_experts, int slots_per_rank,
                                   std::span<const int> replica_counts,
                                   std::span<const double> expert_load);

// Step 3's modelled time (seconds) of a layout for demand [G, E].
double laer_modelled_time(const ExpertLayout& layout, std::span<const double> demand,
                          const LaerOptions& options);

struct LaerPlan {
  ExpertLayout layout;
  std::vector<int> replica_counts;  // [E] of the chosen candidate (before any dropped replica)
  double modelled_time_s = 0;
  int num_candidates = 0;
};

// Steps 1-3. demand: [G, E] (LAER sums the last few steps' counts). Throws kInvalidArgument on a
// size mismatch.
LaerPlan plan_laer(const Topology& topology, int num_experts, int slots_per_rank,
                   std::span<const double> demand, const LaerOptions& options);

}  // namespace cobalt::plan
