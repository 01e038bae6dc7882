// The load a balance tolerance allows on the busiest rank, shared by cobalt+'s spill
// (assign_balanced_cover) and its per-step replica swaps (plan::swap_toward_floor).
#pragma once

#include <cstdint>

namespace cobalt::assign {

// The largest whole number of tasks L with L <= (1 + tolerance) * num_tasks / num_ranks (so a
// busiest rank at L keeps max / mean imbalance within 1 + tolerance), and at least
// ceil(num_tasks / num_ranks), below which no assignment of whole tasks brings the busiest rank.
// A tolerance so large that the cap passes every task (infinite included) returns num_tasks.
// A relative slack of 1e-12 absorbs the rounding of the double product, so that e.g. 1.05 * 20
// gives 21. Throws Error(kInvalidArgument) for num_tasks < 0, num_ranks < 1, or a tolerance that
// is negative or NaN.
int64_t balance_cap(int64_t num_tasks, int num_ranks, double tolerance);

}  // namespace cobalt::assign
