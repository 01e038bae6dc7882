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
// exact for tolerances with two decimals and task counts up to ~10^13. Throws
// Error(kInvalidArgument) for num_tasks < 0, num_ranks < 1, or a tolerance that is negative or NaN.
int64_t balance_cap(int64_t num_tasks, int num_ranks, double tolerance);

}  // namespace cobalt::assign
