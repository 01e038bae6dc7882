// Checks of caller-supplied numbers shared by the library's entry points.
#pragma once

#include <span>
#include <string_view>

namespace cobalt {

// Throws kInvalidArgument naming `what` and the first entry that is NaN, infinite or negative
// ("what: entry 3 is -1, must be finite and >= 0").
void check_finite_non_negative(std::span<const double> values, std::string_view what);

}  // namespace cobalt
