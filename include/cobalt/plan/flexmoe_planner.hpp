// FlexMoE's scheduler (Nie et al., SIGMOD'23: vExperts with Expand / Shrink / Migrate primitives,
// triggered while the balance ratio exceeds a threshold; LAER-MoE's port in PKU-DAIR/Hetu-Galvatron
// `MoEOptimizer.flexmoe_method`, galvatron/core/runtime/moe/prefetch/solver.py).
//
// Expected rank loads come from expert loads w_e split evenly over the expert's replicas (FlexMoE
// splits an expert's tokens evenly over its vExperts; no notion of nodes): L_r = sum_{e on r} w_e /
// r_e. Balance ratio = max_r L_r / min_r L_r (the port's Eq. 6). While the ratio exceeds the
// threshold, and at most max_ops times, take the busiest rank b and the least loaded rank m and
// build two candidate primitives:
//   Expand   the expert h on b with the largest load per replica (ties: lower id; experts already
//            on every rank skipped) gets one more replica on the least loaded rank with a free slot
//            that lacks h (ties: lowest rank). When no rank lacking h has a free slot, Expand comes
//            with a Shrink: on the least loaded rank t lacking h that holds an expert with >= 2
//            replicas, the coldest such expert c (smallest load per replica, ties lower id) loses
//            its replica on t and h takes the slot.
//   Migrate  one replica moves from b to m (the one that minimises max(L_b, L_m) afterwards; ties:
//            the first in b's slot order, which is not id order once primitives have appended
//            replicas); when m is full, a replica of m moves back to b in exchange (swap; ties:
//            the first in b's slot order, then in m's).
// The candidate with the smaller resulting busiest-rank load (then larger least-loaded rank load;
// then Expand) is applied when it improves (max, -min) lexicographically; otherwise scheduling
// stops.
//
// Simplifications (named; docs/peers.md): FlexMoE's cost model (step-time gain vs. the primitive's
// transfer time) is replaced by "apply only if the busiest rank gets lighter"; the port's
// per-node replacement loop assumes every expert has a replica on every node, which the shared
// replica budget does not give, so the paper's primitives are used directly; loads split evenly
// over all replicas, where the port computes its ratio with same-node-first routing.
#pragma once

#include <span>

#include "cobalt/core/expert_layout.hpp"

namespace cobalt::plan {

struct FlexMoeOptions {
  double balance_threshold = 1.15;  // schedule while max/min rank load exceeds this
  int max_ops = 10;                 // primitives per scheduling call (the port's max_iteration)
};

struct FlexMoeSchedule {
  ExpertLayout layout;
  int num_expand = 0;   // replicas added
  int num_shrink = 0;   // replicas removed to make room for an Expand
  int num_migrate = 0;  // moves or swaps between the busiest and the least loaded rank
  double balance_ratio_before = 1;
  double balance_ratio_after = 1;
};

// max / min of rank loads; +inf when the minimum is 0 and the maximum is not; 1 when all are 0.
double flexmoe_balance_ratio(std::span<const double> rank_loads);

// L_r = sum_{e on r} w_e / r_e for a layout and expert loads w [E]: [G].
std::vector<double> even_split_rank_loads(const ExpertLayout& layout,
                                          std::span<const double> expert_load);

// One scheduling call. expert_load: [E] (>= 0). Throws kInvalidArgument on size mismatch.
FlexMoeSchedule flexmoe_schedule(const ExpertLayout& current, std::span<const double> expert_load,
                                 const FlexMoeOptions& options);

}  // namespace cobalt::plan
