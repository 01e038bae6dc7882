// Replica swaps toward a balanceable layout (cobalt+'s per-step stage 2b; not in the paper).
//
// A layout's balance floor (eval::min_max_rank_load) is the lowest maximum rank load any
// assignment reaches on it. It stays high when a set X of experts is confined to too few ranks:
// their tasks exceed the bound times the number of ranks holding any of them. No assignment, and
// no intra-node re-partition that keeps each node's replicas (stage 2), can fix that; a replica
// of some expert of X on one more rank can. Each swap here puts such a replica in one slot:
//
//   1. X and its holders N(X): the source side of a minimum cut of the floor's flow at bound
//      floor - 1 (rank_bound_flow.hpp). A swap lowers the floor only if it gives some e in X a
//      rank r outside N(X).
//   2. candidates (e in X, r outside N(X), slot s of r): s the first free slot of r, or holding
//      an expert f with at least two replicas. Ordered by price (0 for an empty slot or when f
//      keeps a replica on r's node, else removal_cost[node(r), f]: the tokens of that node that now
//      cross nodes for f), then a copy within the node (e already has a replica on r's node) before
//      one across nodes, then the larger count of e, then r, then s, then e.
//   3. the first candidate (at most max_checks are tried) under which every task fits below the
//      current floor (a max flow, warm-started from the flow at floor - 1) is applied, and the new
//      floor computed (a binary search of warm-started flows). A round whose shortfall at
//      floor - 1 exceeds floor - 1 tasks is skipped: one more holder cannot cover it.
//   4. when no candidate of step 2 passes, exchanges: a replica of e in X on a rank a and the
//      replica of an expert f in a slot of a rank r outside N(X) trade places (f not on a; both
//      keep their replica counts; two copies). Every exchange that can lower the floor has this
//      shape (X must gain a rank). Ordered by price (removal_cost of f leaving r's node and of e
//      leaving a's node, when either has no other replica there), then f's count (the load moved
//      into N(X)), then the larger count of e, then r, slot, a, e; at most max_exchange_checks
//      tried, the first that passes applied. (They matter where every rank outside N(X) is full of
//      single replicas: then step 2 has no candidate at all.)
//   5. when neither step 3 nor step 4 lowers the floor (or the shortfall is too large for one
//      swap), a group of up to min(max_group_swaps, swaps still allowed by max_swaps) plain
//      swaps: each the candidate of step 2, for the tight set as the group's earlier swaps left
//      it (any tight expert with tasks, not only one that could close the shortfall alone; not
//      in a slot the group already filled), that leaves the smallest shortfall at floor - 1,
//      strictly below the shortfall before it, while every task still fits at bound `floor` (the
//      floor does not rise; ties: step 2's order). Each of the group's swaps measures up to
//      max_checks candidates, one max flow each. The group is kept when its last swap brings the
//      shortfall to 0 (the floor drops), and dropped whole otherwise. (On OLMoE 4x8 groups bring
//      two of the three steps that single swaps left above the cap within it;
//      docs/cobalt-improvements.md.)
//
// Repeats while fewer than max_swaps swaps are made and the floor is above
// assign::balance_cap(tasks, G, tolerance) (assign/balance_cap.hpp: the spill's cap). Every swap
// of steps 3 and 4, and the last of every group, lowers the floor strictly (a group's earlier
// swaps keep it: their floor_after is the floor before the group); every expert keeps at least
// one replica; no rank gets a second replica of an expert. Deterministic (no randomness, no
// threads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"

namespace cobalt::plan {

struct FloorSwapOptions {
  double tolerance = 0.05;        // stop once the floor is at most assign::balance_cap(...)
  int max_swaps = 1;              // swaps per call (>= 0)
  int max_checks = 64;            // flow checks per swap (>= 1): candidates tried in order
  int max_exchange_checks = 256;  // then exchanges tried in order (>= 0; 0: none)
  int max_group_swaps = 0;        // then swaps in a group (step 5; >= 0; below 2: no groups)
};

struct ReplicaSwap {
  RankId rank = 0;
  int slot = 0;                   // index within the rank's slots
  ExpertId removed = kEmptySlot;  // the replica replaced (kEmptySlot: the slot was free)
  ExpertId added = kEmptySlot;
  int64_t floor_after = 0;  // min_max_rank_load once this swap and the earlier ones are applied
  // An exchange (step 4): `removed` moves into slot exchange_slot of exchange_rank, replacing the
  // replica of `added` there (both keep their replica counts). -1 for a plain swap.
  RankId exchange_rank = -1;
  int exchange_slot = -1;
  bool is_exchange() const { return exchange_rank >= 0; }
};

// Applies `swap` to a layout's slots [G, S] (both slots of an exchange).
void apply_swap(const ReplicaSwap& swap, int slots_per_rank, std::span<ExpertId> slots);

struct FloorSwapResult {
  ExpertLayout layout;
  std::vector<ReplicaSwap> swaps;  // in the order applied
  int64_t floor_before = 0;        // min_max_rank_load on the input layout (0 without tasks)
  int64_t floor_after = 0;         // ... on the result
};

// expert_counts: [E] tasks per expert (>= 0; cobalt+ passes the step's own counts).
// removal_cost: [N, E] >= 0, the price of taking e's last replica off node n (cobalt+: the EMA
// tokens from node n's ranks choosing e). Throws kInvalidArgument when sizes disagree with the
// layout, a count or cost is negative or not finite, or an option is out of range.
FloorSwapResult swap_toward_floor(const ExpertLayout& layout,
                                  std::span<const int64_t> expert_counts,
                                  std::span<const double> removal_cost,
                                  const FloorSwapOptions& options = {});

// The reference of swap_toward_floor: the same candidates in the same order, each check (and each
// floor) a max flow built from scratch, where swap_toward_floor re-augments a kept flow (warm
// starts), skips single-swap rounds whose shortfall no single swap can cover, skips the flow
// check of a change that upper bounds rule out (the flow one more holder can add through its
// rank and to its expert, Hall's condition for an exchange's moved expert; in groups, a swap
// that cannot lower the shortfall far enough for the group to close it), measures a group's
// candidates in order of a lower bound and only as far as the choice needs, each on a kept flow.
// The same swaps, bit for bit; for tests. The reference also checks, with its own flows, that
// every change of a round the bounds rule out fails. (On the Qwen trace's decode steps stage 2b
// runs 79-89% fewer max flows, bounds included; docs/cobalt-improvements.md.)
FloorSwapResult swap_toward_floor_reference(const ExpertLayout& layout,
                                            std::span<const int64_t> expert_counts,
                                            std::span<const double> removal_cost,
                                            const FloorSwapOptions& options = {});

}  // namespace cobalt::plan
