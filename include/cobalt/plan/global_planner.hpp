// Cobalt stage 1, fast backend: a multi-start heuristic for the node-level problem of
// node_plan.hpp, followed by rank packing into an ExpertLayout.
//
// Each restart: (1) minimum replica counts r_e = max(1, ceil(w_e / rank_cap)); (2) an initial
// partition — restart 0 from METIS k-way partitioning of the co-activation graph (vertex weights
// w_e, balanced within 1 + eps; edge weights c_ij; METIS's own seed fixed at 1, so this restart
// does not depend on the configured seed), the others from a seeded greedy that places experts
// hottest-first on the node with the largest co-activation gain under node slot and load caps;
// (3) fill spare slots with the replicas that add the most co-activation; (4) local search with
// move, swap and replace moves until no move improves or max_local_search_passes (50) passes
// ran. Expected load of an expert is split evenly over its
// replicas (u_en = x_en w_e / x_e). The best restart by the Eq. (3) objective wins (ties: lowest
// restart index). Deterministic for a seed.
#pragma once

#include <cstdint>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/plan/node_plan.hpp"

namespace cobalt::plan {

// The most restarts one plan takes: each is a full partition, fill and local search (tens of
// milliseconds at E = 256), so more than this is a mistake, not a search budget.
inline constexpr int kMaxPlannerRestarts = 4096;

struct HeuristicOptions {
  int num_restarts = 4;  // [1, kMaxPlannerRestarts]
  uint64_t seed = 0;
  bool use_metis = true;  // restart 0 starts from a METIS partition
  int max_local_search_passes = 50;
  int num_threads = 1;  // restarts run in parallel; the result is the same for any value
  // Optional incremental start: one extra restart (index num_restarts) begins from this plan (e.g.
  // the layout in force) instead of a fresh partition, then fills and searches as usual. Not owned.
  const NodePlan* initial = nullptr;
  // The local search skips candidate scans that bounds on their gains prove cannot improve on the
  // best move found so far. The moves, and so the result, are those of the plain scan (false): the
  // switch is for the tests that compare the two.
  bool bound_pruning = true;
};

struct HeuristicResult {
  NodePlan plan;  // the best objective among the restarts within the load cap (all when none is)
  double objective = 0;
  int best_restart = 0;
  bool within_cap = true;  // `plan` passes check_node_plan (false: no restart met the load cap)
  std::vector<double> restart_objectives;
  std::vector<NodePlan> restart_plans;  // every restart's final plan (for true-objective selection)
  std::vector<uint8_t> restart_within_cap;  // [restarts] 1 when that plan passes check_node_plan
};

// The load cap is the heuristic's target, not a guarantee: a greedy placement that cannot meet
// it puts each replica on the node it exceeds least, and the plan says so (within_cap false;
// check_node_plan names the node). The incremental restart starts from `initial` as it is, so it
// may exceed the cap where the loads have moved; its plan is flagged like any other. Throws
// kFailedPrecondition when the slots cannot hold every expert's replicas, and kInvalidArgument
// for an invalid input or an `initial` plan of another shape (require_plan_shape).
HeuristicResult plan_global_heuristic(const GlobalPlanInput& input,
                                      const HeuristicOptions& options);

// Rank packing: places each node's replicas on its ranks (greedy bin packing by expected load, no
// two replicas of an expert on one rank, at most S per rank; falls back to a round-robin packing
// that always fits). When `previous` is given, a replica prefers its previous rank among the least
// loaded candidates, and each node's packed groups are then put on its ranks by a maximum-weight
// matching that keeps the most replicas where `previous` has them (rank_matching.hpp); loads and
// cross-node traffic do not depend on that permutation, only the copies do. Writes the expected
// load of each slot [G, S] to *slot_loads if non-null. The per-rank load cap is not guaranteed:
// the plan bounds each node's load, and packing a node's replicas onto its ranks by greedy bin
// packing (or the fallback, which ignores loads) can leave a rank above (1 + eps) W / G; stage 2
// and the assignment work from the real loads. Throws kInvalidArgument for a plan of another
// shape (require_plan_shape), more replicas of an expert on a node than its ranks, or more
// replicas on a node than its slots (a plan made for another input).
ExpertLayout pack_ranks(const GlobalPlanInput& input, const NodePlan& plan,
                        const ExpertLayout* previous, std::vector<double>* slot_loads);

// Node-level view of a layout: replica counts per (expert, node) and loads split evenly over
// replicas.
NodePlan node_plan_of(const ExpertLayout& layout, std::span<const double> expert_load);

}  // namespace cobalt::plan
