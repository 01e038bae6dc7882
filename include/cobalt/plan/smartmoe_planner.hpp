// SmartMoE's online expert re-placement (Zhai et al., ATC'23; thu-pacman/SmartMoE-AE,
// src/fastmoe/fmoe/smartmoe/mapping.py `greedy_gen_mapping_from_history`), with the replication
// SmartMoE allows: an expert has either one replica or a replica on every rank (the Cobalt paper's
// description of the SmartMoE baseline).
//
// Greedy placement for a given set F of fully replicated experts: every rank starts with the load
// of its own tokens for F (a full replica runs where its token is); the other experts, by load
// descending (ties: lower id first), go one by one to the rank with the smallest load among ranks
// with a free slot (ties: lowest rank), except that an expert stays on its current rank when that
// rank has a free slot and ties the smallest load (SmartMoE's rule to avoid needless moves).
// Ranks hold at most ceil((E - |F|) / G) single replicas: SmartMoE keeps the number of experts per
// rank fixed (mapping.py: an expert goes to a worker only while it holds fewer than num_expert =
// E / G), so slots beyond that stay empty rather than letting the greedy pile light experts up.
//
// plan_smartmoe tries F = the f hottest experts for every f from 0 to the most the budget allows,
// f_max = max f with E - f <= G (S - f), keeps the f whose placement has the smallest predicted
// busiest-rank load (ties: smaller f), and returns it only when that load is strictly smaller than
// the current layout's; otherwise the current layout stays (SmartMoE's `cur_max > new_max` check).
//
// Simplification (named; docs/peers.md): SmartMoE-AE places single replicas only and delegates
// replication to FasterMoE-style shadowing; here the fully replicated set is chosen by the same
// busiest-rank objective as the placement, so both live in one budgeted layout.
#pragma once

#include <span>

#include "cobalt/core/expert_layout.hpp"

namespace cobalt::plan {

// Largest number of fully replicated experts the budget allows: max f in [0, min(S, E - 1)] with
// E - f <= G (S - f). (With G = 1 every expert is trivially on every rank; returns 0.)
int smartmoe_max_full_replicas(int num_experts, int num_ranks, int slots_per_rank);

struct SmartMoePlacement {
  ExpertLayout layout;
  int num_full_replicas = 0;
  double max_rank_load = 0;  // predicted busiest-rank load (source-rank-first even split)
};

// The greedy placement above with the num_full hottest experts fully replicated. demand: [G, E]
// expected tasks from each source rank for each expert. `current` provides topology, S and the
// current ranks for the stay rule. Throws kInvalidArgument when num_full exceeds the budget.
SmartMoePlacement smartmoe_greedy_placement(const ExpertLayout& current,
                                            std::span<const double> demand, int num_full);

struct SmartMoePlan {
  SmartMoePlacement placement;  // the layout in force after planning
  bool changed = false;         // false: the current layout was kept
  double current_max_rank_load = 0;
};

SmartMoePlan plan_smartmoe(const ExpertLayout& current, std::span<const double> demand);

}  // namespace cobalt::plan
