#include "cobalt/assign/balance_cap.hpp"

#include <algorithm>
#include <cmath>

#include "cobalt/core/error.hpp"

namespace cobalt::assign {

int64_t balance_cap(int64_t num_tasks, int num_ranks, double tolerance) {
  COBALT_CHECK_ARG(num_tasks >= 0, "balance cap: num_tasks {} must be >= 0", num_tasks);
  COBALT_CHECK_ARG(num_ranks >= 1, "balance cap: num_ranks {} must be >= 1", num_ranks);
  COBALT_CHECK_ARG(tolerance >= 0, "balance cap: tolerance {} must be >= 0 (not NaN)", tolerance);
  const int64_t whole_task_floor = (num_tasks + num_ranks - 1) / num_ranks;
  const double allowed =
      (1.0 + tolerance) * static_cast<double>(num_tasks) / static_cast<double>(num_ranks);
  if (!(allowed < static_cast<double>(num_tasks))) return num_tasks;
  const auto cap = static_cast<int64_t>(std::floor(allowed * (1.0 + 1e-12)));
  return std::clamp(cap, whole_task_floor, num_tasks);
}

}  // namespace cobalt::assign
