#include "cobalt/assign/balance_cap.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cobalt/core/error.hpp"

namespace cobalt::assign {

// The slack below covers two roundings of a 64-bit significand (x86-64's extended format; quad
// precision, e.g. on aarch64 Linux, is finer); a plain-double long double would need a larger one.
static_assert(std::numeric_limits<long double>::digits >= 64,
              "balance_cap assumes a long double with at least a 64-bit significand");

int64_t balance_cap(int64_t num_tasks, int num_ranks, double tolerance) {
  COBALT_CHECK_ARG(num_tasks >= 0, "balance cap: num_tasks {} must be >= 0", num_tasks);
  COBALT_CHECK_ARG(num_ranks >= 1, "balance cap: num_ranks {} must be >= 1", num_ranks);
  COBALT_CHECK_ARG(tolerance >= 0, "balance cap: tolerance {} must be >= 0 (not NaN)", tolerance);
  // ceil(num_tasks / num_ranks) without overflow near INT64_MAX.
  const int64_t whole_task_floor = num_tasks / num_ranks + (num_tasks % num_ranks != 0);
  // In long double (a 64-bit significand on x86-64), where T (1 + tolerance) / G rounds twice by
  // at most 2^-64 relative each. The slack covers those roundings (2^-63) and the tolerance's own
  // rounding to a double (at most 2^-53 of the tolerance: 1.15 is stored below 1.15, yet 1.15 x
  // 20 must give 23), and stays below the distance from a two-decimal tolerance's exact product
  // to the next integer (at least 1 / (100 G)) for task counts below 2^52 / (100 t (1 + t)).
  const long double allowed = (1.0L + static_cast<long double>(tolerance)) *
                              static_cast<long double>(num_tasks) /
                              static_cast<long double>(num_ranks);
  if (!(allowed < static_cast<long double>(num_tasks))) return num_tasks;
  const long double slack = allowed * (static_cast<long double>(tolerance) * 0x1p-52L + 0x1p-63L);
  const long double cap = std::floor(allowed + slack);
  if (cap >= static_cast<long double>(num_tasks)) return num_tasks;  // also keeps the cast in range
  return std::clamp(static_cast<int64_t>(cap), whole_task_floor, num_tasks);
}

}  // namespace cobalt::assign
