// TopoEP's per-microbatch solver (TopoEP paper §4.3; DESIGN.md §4): from the current routing
// matrix Omega it decides the replica placement x and the per-(source rank, expert, destination
// rank) task quotas q.
//
// Model (paper §4.1-4.2): expert e keeps a fixed main instance on rank main(e) = floor(e G / E)
// (C5); each rank's slots_per_rank slots hold its mains and then temporary replicas (C3): rank r
// has slots_per_rank - (its mains) replica slots, which is the paper's N_slot = slots_per_rank -
// E / G on every rank when G divides E (otherwise ranks hold floor or ceil(E / G) mains, and the
// ones with fewer have a replica slot more). NVLink domains are the topology's nodes.
//   (1) Inter-node placement. D[d, e] = sum of Omega[s, e] over the ranks s of node d. For every
//       node d and expert e whose main is on another node, the benefit is
//       b = 2 D[d, e] S_tok - |W_e|. Each node takes its positive-benefit candidates in descending
//       order of D (the benefit's order, except where 2 D S_tok rounds to equal or infinite
//       doubles; ties: lower expert id) and puts each on the least occupied rank of d (fewest
//       used slots, mains included; ties: lower rank) that has a free slot; it stops when the
//       node is full.
//       So a replica outside main(e)'s node exists only where |W_e| < 2 D S_tok (C4).
//   (2) Routing. Each (s, e) demand goes to the instances of e on s's node if there are any, else
//       to all instances of e, split evenly: each of the k chosen instances (ascending rank)
//       gets floor(w / k), and the w mod k leftover tasks go one each to the instances at
//       positions (s + i) mod k, i = 0 .. (w mod k) - 1 (rotating the remainder by source rank so
//       no instance collects every leftover). U[e, r] and L[r] follow.
//   (3) Intra-node refinement, per node independently: repeatedly take the busiest rank r_b of
//       the node (ties: lower rank) and, over the experts e with U[e, r_b] > 0 and the other ranks
//       r_t of the node that host e or have a free replica slot, evaluate
//       delta = min(U[e, r_b], floor((L[r_b] - L[r_t]) / 2)). Candidates with delta > 0 are
//       ranked by delta (larger first), then target load L[r_t] (smaller first), then cost (the
//       parameter copy a new replica needs: none when r_t already hosts e, an NVLink copy when
//       main(e) is on the node, an inter-node copy otherwise), then lower expert id, then lower
//       r_t. The best one moves delta tasks of e from r_b to r_t (creating the replica when
//       needed). Which source's tasks move: those from r_t itself first (they become
//       rank-local), then the other sources in the order their quotas on r_b were created
//       (routed quotas by ascending source, then those added by earlier moves of e; a quota
//       emptied by a move and refilled by a later one keeps its first position), tasks from
//       r_b itself last. The
//       node stops when its busiest rank has no candidate (the sum of squared loads strictly
//       decreases with every move, so this terminates).
//   Finally, a temporary replica left with no tasks is not materialised (it would cost a
//   parameter copy for nothing); this removes instances only, so C1-C5 still hold.
//
// Deterministic: the plan is a pure function of the inputs (no randomness, no threads); every
// rank computes the identical plan.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::plan {

struct TopoEpInput {
  Topology topology{1, 1};
  int num_experts = 0;
  int slots_per_rank = 0;           // S: main instances + temporary replica slots per rank
  double token_bytes = 0;           // S_tok: bytes of one routed activation
  double expert_param_bytes = 0;    // |W_e| (the same for every expert)
  std::span<const int64_t> demand;  // Omega [G, E]: tasks from rank s choosing expert e (>= 0)
};

// One task quota of a source rank: q[src, expert, dst] = count (> 0).
struct TopoEpQuota {
  ExpertId expert;
  RankId dst;
  int64_t count;
};

struct TopoEpStats {
  int64_t num_inter_node_replicas = 0;  // placed by stage (1)
  int64_t num_intra_node_replicas = 0;  // created by stage (3)
  int64_t num_refinement_moves = 0;     // stage (3) updates applied
  int64_t num_dropped_replicas = 0;     // temporary replicas left without tasks
};

struct TopoEpPlan {
  int num_ranks = 0, num_experts = 0, slots_per_rank = 0;
  // [G, S]: expert per slot, kEmptySlot where unused; each rank lists its mains (ascending) and
  // then its temporary replicas (ascending).
  std::vector<ExpertId> slots;
  // Quotas grouped by source rank: source s owns quotas[source_offsets[s] ..
  // source_offsets[s + 1]), sorted by (expert, dst). source_offsets: [G + 1].
  std::vector<int64_t> source_offsets;
  std::vector<TopoEpQuota> quotas;
  std::vector<int64_t> rank_loads;  // L [G]
  TopoEpStats stats;
};

// main(e) = floor(e G / E).
inline RankId topoep_main_rank(ExpertId e, int num_experts, int num_ranks) {
  return static_cast<RankId>(static_cast<int64_t>(e) * num_ranks / num_experts);
}

// Reusable solver: keeps its scratch buffers between calls (one per thread; not thread-safe).
// Cost: three passes over Omega in row order (node demand, instance loads, the quotas written
// straight into the plan; stage (2)'s quotas are not stored but recomputed from the routing
// tables), one column of Omega per expert that refinement moves, per (moved expert, node) one
// pass over that expert's quotas (indexed by (src, dst) in a hash table of the node's quotas),
// and per move work proportional to the quotas it takes.
class TopoEpSolver {
 public:
  // Throws cobalt::Error (kInvalidArgument) when num_experts < 1, demand is not [G, E] or holds a
  // negative value, an entry above 2^40 or more than 2^52 tasks in all, or slots_per_rank <
  // ceil(E / G) (no room for the main instances).
  void solve(const TopoEpInput& input, TopoEpPlan& plan);

 private:
  struct Instance {
    RankId rank;
    int64_t load;  // U[e, rank]
  };
  struct Move {
    ExpertId expert;
    RankId from, to;
    int64_t count;
  };
  struct SourcedQuota {  // a quota of one expert, with its source
    RankId src;
    RankId dst;
    int64_t count;
  };
  void place_inter_node(const TopoEpInput& input);
  void route(const TopoEpInput& input);
  void refine_node(const TopoEpInput& input, NodeId node);
  void apply_moves(ExpertId e, size_t& next_move);
  void emit(const TopoEpInput& input, TopoEpPlan& plan);

  int num_ranks_ = 0, num_experts_ = 0, num_nodes_ = 0, per_node_ = 0, slots_per_rank_ = 0;
  std::vector<int64_t> node_demand_;                 // D [N, E]
  std::vector<std::vector<Instance>> instances_;     // per expert, ascending rank
  std::vector<std::vector<ExpertId>> rank_experts_;  // per rank: experts it hosts
  std::vector<int> slots_used_;                      // per rank: mains + temporary replicas
  std::vector<int64_t> rank_loads_;                  // L [G]
  std::vector<RankId> main_rank_;                    // [E]
  std::vector<NodeId> main_node_;                    // [E]
  std::vector<RankId> route_ranks_;                  // instance ranks at stage (2), by expert
  std::vector<int64_t> route_loads_;                 // their loads, parallel to route_ranks_
  std::vector<int32_t> route_first_, route_count_;   // [N, E]: the run of route_ranks_ node n uses
  int64_t num_routed_quotas_ = 0;                    // quotas stage (2) creates
  std::vector<int32_t> num_fill_;                    // scratch [G]: slots filled per rank
  std::vector<Move> moves_;                          // stage (3) updates in order
  std::vector<uint8_t> moved_;                       // [E]: expert has stage (3) moves
  std::vector<std::vector<SourcedQuota>> final_;     // quotas of moved experts, by (src, dst)
  std::vector<int64_t> candidates_;                  // scratch: candidate experts
  std::vector<int64_t> to_entry_;                    // scratch [E]: cursor into final_
  std::vector<std::vector<int64_t>> dst_entries_;    // scratch [>= ranks per node]: quota indices
  std::vector<int> touched_dsts_;                    // scratch: non-empty lists of dst_entries_
  std::vector<int64_t> quota_slots_;                 // scratch: hash table (src, dst) -> quota
  int64_t num_slotted_ = 0;                          // entries in quota_slots_
  std::vector<int64_t> half_gap_;                    // scratch [ranks per node]
  TopoEpStats stats_;
};

// Convenience: one call with a fresh solver.
TopoEpPlan solve_topoep(const TopoEpInput& input);

// What solve() checks before it starts (the errors listed there), except the sign of each demand
// entry, which solve() checks in its first pass over Omega and fail_negative_demand reports.
void check_topoep_input(const TopoEpInput& input);
// Throws cobalt::Error (kInvalidArgument) naming the first negative entry of Omega's row `source`.
[[noreturn]] void fail_negative_demand(const TopoEpInput& input, RankId source);

// The simple reference TopoEpSolver::solve must equal bit for bit: the three stages above with
// dense [E, G] matrices and every refinement move applied to the quotas at once (O(E G) per move;
// for tests, not for the training step). Throws as solve() does.
TopoEpPlan solve_topoep_reference(const TopoEpInput& input);

}  // namespace cobalt::plan
