// Wall-clock timing of the per-step operations on one real batch (`cobalt bench`): the library
// calls the `cobalt`, `cobalt+` and `topoep` policies make in a training step, each repeated on
// the same batch, at the caller's cluster shape and replica budget. Where the Google Benchmark
// suite (bench/) times fixed synthetic shapes, this answers "how long do they take on my routing,
// my cluster and this machine". Times are measured, not modelled; on a shared machine they carry
// its noise, which the minimum next to the median shows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cobalt/core/routing_batch.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::eval {

struct StepTimingOptions {
  Topology topology{1, 1};
  int slots_per_rank = 0;         // S of the Cobalt layout (slots_for_rho / slots_for_extra)
  int topoep_slots_per_rank = 0;  // S of the TopoEP solver (>= ceil(E / G))
  double eps = 0.15;              // load tolerance of the global planner
  int planner_restarts = 8;       // as the cobalt policy (plus its incremental restart)
  uint64_t seed = 0;
  int64_t step = 0;  // the (step, layer) of the batch: keys of the assignment's RNG
  int layer = 0;
  int num_threads = 1;
  int reps = 5;                // timed repetitions of each operation, after one untimed run
  double token_bytes = 14336;  // TopoEP's S_tok and |W_e| (the cost model's sizes)
  double expert_param_bytes = 4.2e7;
  // Called with each operation's name before it is timed (progress output); may be empty.
  std::function<void(const std::string&)> on_operation;

  // Throws cobalt::Error (kInvalidArgument) naming the bad field and its valid range.
  void validate(const RoutingBatch& batch) const;
};

struct TimedOperation {
  std::string name;       // e.g. "assign"
  std::string what;       // one line: the library call and what it computes
  double median_ms = 0;   // median wall time of the timed repetitions
  double min_ms = 0;      // fastest repetition
  int reps = 0;           // timed repetitions
  double items = 0;       // work per call in `unit`s (tokens, tasks, ...); 0: not a rate
  std::string unit;       // "tokens", "tasks", ...
  double copy_ratio = 0;  // > 0: the copy bound's median / this median (same bytes), else 0
  std::string note;       // a result of the call worth reading next to its time (counts, ...)
};

// Times, in this order: copy_bound (memcpy of the batch's ids and sources: the floor of a
// one-pass kernel over the same bytes), stats_update (EMA loads and co-activation),
// global_plan (stage-1 heuristic: planner_restarts restarts with the METIS start, plus the
// incremental restart from static EP, as the cobalt policy's planning call), pack_ranks,
// rebalance (stage 2), assign (Algorithm 1), assign_balanced (cobalt+), dispatch_layout,
// demand_matrix (Omega [G, E]) and topoep_solve. Each operation runs once untimed, then `reps`
// times. Throws cobalt::Error for invalid options (validate) and whatever the operations throw
// (e.g. kFailedPrecondition when the replica budget cannot hold the experts).
std::vector<TimedOperation> time_step_operations(const RoutingBatch& batch,
                                                 const StepTimingOptions& options);

}  // namespace cobalt::eval
