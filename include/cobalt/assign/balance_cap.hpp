// The load a balance tolerance allows on the busiest rank, shared by cobalt+'s spill
// (assign_balanced_cover) and its per-step replica swaps (plan::swap_toward_floor).
#pragma once

#include <cstdint>

namespace cobalt::assign {

// The largest whole number of tasks L with L <= (1 + tolerance) * num_tasks / num_ranks (so a
// busiest rank at L keeps max / mean imbalance within 1 + tolerance), and at least
// ceil(num_tasks / num_ranks), below which no assignment of whole tasks brings the busiest rank.
// A tolerance so large that the cap passes every task (infinite included) returns num_tasks.
// A small slack absorbs the tolerance's rounding to a double, so that e.g. 1.15 * 20 gives 23:
// exact for tolerances t with two decimals and task counts below 2^52 / (100 t (1 + t)), where the
// slack stays under 1 / (100 G) (8.6 x 10^14 tasks at t = 0.05, 5.6 x 10^12 at t = 2.39; above,
// a product just below an integer can round up to it). Throws
// Error(kInvalidArgument) for num_tasks < 0, num_ranks < 1, or a tolerance that is negative or NaN.
int64_t balance_cap(int64_t num_tasks, int num_ranks, double tolerance);

}  // namespace cobalt::assign
