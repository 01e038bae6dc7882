// Exact backend for Cobalt stage 1 (paper Eq. (3) / Appendix B, DESIGN.md §4): the node-level
// MILP of node_plan.hpp solved with COIN-OR CBC, time-limited, warm-started and guarded by a hard
// watchdog.
//
// Formulation (node level, so no intra-node symmetry; M = ranks per node, S = slots per rank,
// cap = input.rank_load_cap(), pairs P = {i < j : c_ij > 0}):
//
//   maximise   sum_{n, (i,j) in P} c_ij y_ijn  (+ sum_{e,n} source_weight d_ne z_en, see below)
//   subject to z_en <= x_en <= M z_en         x_en in {0..M} replicas, z_en in {0,1} presence
//              sum_n z_en >= 1                  every expert somewhere
//              sum_e x_en <= M S                slots of node n
//              sum_n u_en = w_e, u_en >= 0      load split (continuous)
//              u_en <= cap x_en                 no replica above one rank's cap
//              sum_e u_en <= M cap              node load
//              y_ijn <= z_in, y_ijn <= z_jn     y_ijn in [0, 1]: pair co-located on n
//
// - y is continuous: for integer z the best y is min(z_in, z_jn), already 0/1, so integrality is
//   implied (measured 1.7-3.2x faster to a proof than binary y at E=16..32, N=2).
// - Degree cuts (MilpOptions::degree_cuts): sum_{j:(i,j) in P} y_ijn + x_in <= M S z_in (a present
//   expert leaves at most M S - x_in slots to others). This dominates DESIGN.md's
//   sum_j y_ijn <= (M S - 1) z_in (as x_in >= z_in) and is emitted only where the bounds do not
//   imply it (deg(i) + M > M S). Without it E=32 on 2x8 is not proven within 60 s.
// - Source anchoring (input.source_demand non-empty and source_weight != 0, see node_plan.hpp): the
//   objective gains source_weight d_ne z_en, and nodes are no longer interchangeable.
// - Symmetry: otherwise nodes are interchangeable, so expert 0 is fixed to node 0 (z_00 = 1). The
//   warm start is relabelled into that frame (its first node holding expert 0 swapped with node 0)
//   and the answer is relabelled back, so a returned warm start keeps its node labels.
// - Scaling: CBC sees objective weights divided by their maximum and loads in units of cap; every
//   reported number is in input units.
//
// Watchdog: CBC does not check its time limit inside the root LP / root cut loop (E=128 on 4x8 does
// not finish the root LP in 12 s here), so every solve runs in a fork()ed child process that runs
// CBC (CbcMain1 with the default strategy: preprocessing, cuts, heuristics) and writes status,
// bound and the x / u columns back through a pipe, then _exit()s. The parent polls until
// `hard_timeout_s`, then SIGKILLs the child and returns the warm start with status "watchdog". The
// child also dies with the calling thread (PR_SET_PDEATHSIG).
// Fork caveats: only the calling thread exists in the child. The parent prepares every array before
// fork(); the child then allocates (glibc's fork() resets malloc's locks, so this is safe in
// practice on Linux/glibc, though not async-signal-safe by the letter of POSIX) and runs CBC, which
// takes no lock another parent thread could hold, except stdio: the child points stdout/stderr at
// /dev/null (unless verbose) with dup2 before CBC prints anything. No exec, no atexit handlers, no
// return into the caller's stack. Each call costs a fork (~1 ms plus page-table copy of the
// caller).
//
// The returned plan's load shares are recomputed from its integer replica counts by an exact
// max-flow (assign_load_shares), so they satisfy check_node_plan without CBC's tolerances; the
// objective is recomputed with coactivation_objective. A warm start always survives: if CBC returns
// nothing better, the warm start is the answer (ties included, so an optimal warm start comes back
// unchanged, node labels and load shares as given). Note: given a MIP start, CBC skips its initial
// feasibility pump, so with a weak warm start at E >= 64 CBC may return just the warm start where a
// cold start would have found better (measured: E=64 on 4x8, 30 s).
#pragma once

#include <cstdint>
#include <string>

#include "cobalt/plan/node_plan.hpp"

namespace cobalt::plan {

// Largest model plan_global_milp builds: 3 E N + (co-activated pairs) N columns. Above it (e.g.
// E = 1024 on 64 nodes: ~34 M) it throws kFailedPrecondition instead of spending minutes and
// gigabytes before the watchdog starts; the heuristic is the backend for such sizes.
inline constexpr int64_t kMaxMilpColumns = 4'000'000;

struct MilpOptions {
  // CBC's own (wall-clock) time limit. CBC honours it between nodes, not inside the root LP.
  double time_limit_s = 60;
  // Emit the degree cuts (tighter bound, more rows).
  bool degree_cuts = true;
  // Optional feasible plan given to CBC as its MIP start (must pass check_node_plan; not owned,
  // must outlive the call). Also the answer when the watchdog fires or CBC returns nothing better.
  const NodePlan* warm_start = nullptr;
  // CBC threads (CBC's "-threads"); 1 = deterministic serial search.
  int num_threads = 1;
  // Hard wall-clock limit on the solve, enforced by killing the solver process. The model is
  // built before, in the calling process, and its size is bounded (kMaxMilpColumns), so for the
  // sizes this backend accepts the whole call ends within about this limit.
  // <= 0: time_limit_s * 1.5 + 5.
  double hard_timeout_s = -1;
  // Let CBC print its log (to the caller's stdout) instead of silencing it.
  bool verbose = false;
};

struct MilpResult {
  NodePlan plan;              // valid (check_node_plan) when has_solution; else zero-filled E x N
  bool has_solution = false;  // a feasible plan (CBC's or the warm start) is in `plan`
  bool optimal = false;       // CBC proved `plan` optimal (CBC gap 1e-9 relative; gap <= 1e-6 here)
  double objective = 0;       // coactivation_objective(plan); 0 without a solution
  // Upper bound on the optimum, never below objective: with a solution, the smaller of CBC's best
  // bound (if one came back) and a cheap combinatorial bound (each node scores at most its
  // C(min(E, M S), 2) largest pair weights); without one, CBC's bound or +inf (watchdog, failure);
  // -inf when CBC proved the problem infeasible.
  double bound = 0;
  double gap = 0;      // relative_gap(objective, bound); +inf without a solution
  double seconds = 0;  // wall time of the whole call (fork, solve, transfer)
  // "optimal", "time_limit" (CBC stopped on its limit), "watchdog" (killed at hard_timeout_s),
  // "infeasible", "stopped" (CBC stopped for another reason), "error" (the solver process failed;
  // the warm start, if any, is returned).
  std::string status;
  // With status "error": why, e.g. "the solver failed: out of memory (std::bad_alloc)" or "the
  // solver process was killed by signal 9 (Killed); out of memory? ..."; empty otherwise.
  std::string error;
};

// Solves the node-level MILP. Throws cobalt::Error (kInvalidArgument / kFailedPrecondition) when
// `input` is invalid (GlobalPlanInput::validate), when options are out of range (time_limit_s <= 0,
// num_threads < 1), or when the warm start has the wrong shape or fails check_node_plan; kInternal
// when the solver process cannot be started (pipe/fork failure).
MilpResult solve_global_milp(const GlobalPlanInput& input, const MilpOptions& options);

// (bound - objective) / max(1, |bound|): the share of the bound a plan leaves on the table (0 at a
// proven optimum; never negative for a valid bound). +inf when bound is +inf; NaN when bound is
// -inf (infeasible) or either is NaN.
double relative_gap(double objective, double bound);

// Fills plan.load_share for the replica counts in plan.replicas with a feasible split of the expert
// loads (sum_n u_en = w_e, u_en <= cap x_en, node load <= M cap), found by an exact max-flow over
// source -> expert (w_e) -> node (cap x_en) -> sink (M cap). Returns false (leaving load_share
// zeroed) when no such split exists. Requires plan's shape to match input (throws kInvalidArgument
// otherwise).
bool assign_load_shares(const GlobalPlanInput& input, NodePlan& plan);

}  // namespace cobalt::plan
