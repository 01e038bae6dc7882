// Wall-clock timing of the per-step work on one real batch (`cobalt bench`), at the caller's
// cluster shape and replica budget, on this machine. Two kinds of rows:
//   * the library calls, each alone (statistics, the stage-1 heuristic, rank packing, Algorithm 1,
//     stage 2, cobalt+'s assignment, the runtime's dispatch layout, TopoEP's Omega and solver), to
//     see where time goes;
//   * whole policy steps (`cobalt`, `cobalt+`, `topoep`) through Policy::run, exactly as the
//     simulator runs them: a step on which the global plan is due, and an ordinary step.
// Where the Google Benchmark suite (bench/) times fixed synthetic shapes, this answers "how long
// on my routing and my cluster". Times are measured, not modelled; on a shared machine they carry
// its noise, which the minimum next to the median shows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cobalt/core/routing_batch.hpp"
#include "cobalt/core/topology.hpp"
#include "cobalt/eval/cost_model.hpp"

namespace cobalt::eval {

struct StepTimingOptions {
  Topology topology{1, 1};
  int slots_per_rank = 0;    // S for every layout (slots_for_rho / slots_for_extra)
  double eps = 0.15;         // load tolerance of the global planner, in [0, plan::kMaxEps]
  int planner_restarts = 8;  // the policies' default
  uint64_t seed = 0;
  int64_t step = 0;  // the (step, layer) of the batch: the assignment's RNG keys
  int layer = 0;
  int num_threads = 1;
  int reps = 5;             // timed repetitions of each row, after one untimed run
  double max_seconds = 10;  // a row stops repeating once its timed runs took this long (>= 1 run)
  // TopoEP's S_tok and |W_e| (`cobalt bench` passes its model's); defaults: CostParams{}'s.
  double token_bytes = CostParams{}.token_bytes();
  double expert_param_bytes = CostParams{}.expert_param_bytes();
  // Called with each row's name before it is timed (progress output); may be empty.
  std::function<void(const std::string&)> on_operation;

  // Throws cobalt::Error (kInvalidArgument) naming the bad field and its valid range.
  void validate(const RoutingBatch& batch) const;
};

struct TimedOperation {
  std::string name;          // e.g. "assign", "cobalt_plan_step"
  std::string what;          // one line: what is timed
  bool policy_step = false;  // a whole Policy::run, not one library call
  double median_ms = 0;      // median wall time of the timed runs (mean of the middle two if even)
  double min_ms = 0;         // fastest run
  int reps = 0;              // timed runs (fewer than asked when max_seconds ran out)
  double items = 0;          // work per call in `unit`s (tokens, tasks); 0: not a rate
  std::string unit;
  double copy_ratio = 0;  // > 0: copy_bound's median / this median (same bytes), else 0
  std::string note;       // a result of the call worth reading next to its time
};

// The rows, in order: copy_bound (memcpy of the batch's ids and sources: the floor of a one-pass
// kernel over the same bytes), stats_update, plan_heuristic, pack_ranks, assign (the AVX-512
// kernel where the CPU has it), assign_portable (the same call on the portable loop; the run throws
// kInternal if its ranks differ), rebalance (from the replica task counts of that assignment),
// assign_balanced, dispatch_layout, dispatch_fresh, demand_matrix, topoep_solve; then
// cobalt_plan_step, cobalt_step, cobalt+_plan_step, cobalt+_step, topoep_step
// (kNumTimedOperations rows; on_operation is called once per row). Throws cobalt::Error for invalid
// options (validate) and whatever the calls throw (e.g. kFailedPrecondition when the replica budget
// cannot hold the experts).
inline constexpr int kNumTimedOperations = 17;
std::vector<TimedOperation> time_step_operations(const RoutingBatch& batch,
                                                 const StepTimingOptions& options);

}  // namespace cobalt::eval
