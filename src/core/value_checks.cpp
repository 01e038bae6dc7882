#include "cobalt/core/value_checks.hpp"

#include <cmath>

#include "cobalt/core/error.hpp"

namespace cobalt {

void check_finite_non_negative(std::span<const double> values, std::string_view what) {
  for (size_t i = 0; i < values.size(); ++i) {
    COBALT_CHECK_ARG(std::isfinite(values[i]) && values[i] >= 0,
                     "{}: entry {} is {}, must be finite and >= 0", what, i, values[i]);
  }
}

}  // namespace cobalt
