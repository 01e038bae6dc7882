#include "cobalt/core/memory.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "cobalt/core/environment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"

namespace cobalt {
namespace {

constexpr double kKiB = 1024.0, kMiB = kKiB * 1024.0, kGiB = kMiB * 1024.0, kTiB = kGiB * 1024.0;

// COBALT_MEMORY_LIMIT in bytes; 0 when unset or empty.
double memory_limit_from_environment() {
  // From the snapshot (core/environment.hpp): budgets are checked on planning threads too.
  const std::optional<std::string> env = environment_settings().memory_limit;
  if (!env || env->empty()) return 0.0;
  const std::string& text = *env;
  size_t used = 0;
  // std::stod would skip leading blanks; a trailing one is refused as an unknown suffix, so a
  // leading one is too.
  double value = 0;
  try {
    if (!std::isspace(static_cast<unsigned char>(text.front()))) value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  double unit = 1;
  std::string suffix = text.substr(used);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (suffix == "K" || suffix == "k") unit = kKiB;
  if (suffix == "M" || suffix == "m") unit = kMiB;
  if (suffix == "G" || suffix == "g") unit = kGiB;
  if (suffix == "T" || suffix == "t") unit = kTiB;
  const bool known_suffix = suffix.empty() || unit > 1;
  COBALT_CHECK_ARG(
      used > 0 && known_suffix && std::isfinite(value) && value * unit >= kKiB &&
          value * unit < 1e18,
      "COBALT_MEMORY_LIMIT '{}' is not a memory size (valid: at least 1K: a byte count >= 1024, "
      "or a number with a K, M, G or T suffix, e.g. 512M or 2.5G)",
      printable(text, 40));
  return value * unit;
}

}  // namespace

double physical_memory_bytes() {
  static const double bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
    double total = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0.0;
    // A container's memory limit (cgroup v2), when it is lower than the host's memory.
    std::ifstream limit_file("/sys/fs/cgroup/memory.max");
    std::string limit;
    if (limit_file >> limit && !limit.empty() && limit != "max") {
      try {
        const double cgroup = std::stod(limit);
        if (cgroup > 0 && (total <= 0 || cgroup < total)) total = cgroup;
      } catch (const std::exception&) {
      }
    }
    return total;
  }();
  return bytes;
}

double memory_budget_bytes() {
  const double limit = memory_limit_from_environment();
  if (limit > 0) return limit;
  return kMemoryBudgetShare * physical_memory_bytes();
}

std::string format_bytes(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.1f} GiB", bytes / kGiB);
  if (bytes >= kMiB) return fmt::format("{:.0f} MiB", bytes / kMiB);
  return fmt::format("{:.0f} KiB", std::ceil(bytes / kKiB));
}

void require_memory(double bytes, std::string_view what, std::string_view hint) {
  const double budget = memory_budget_bytes();
  if (budget <= 0 || bytes <= budget) return;
  const std::string source =
      memory_limit_from_environment() > 0
          ? std::string("COBALT_MEMORY_LIMIT")
          : fmt::format("{:.0f}% of this machine's {} of memory; COBALT_MEMORY_LIMIT sets another",
                        100 * kMemoryBudgetShare, format_bytes(physical_memory_bytes()));
  fail(ErrorCode::kFailedPrecondition, "{} needs {}, above the memory budget of {} ({}){}{}", what,
       format_bytes(bytes), format_bytes(budget), source, hint.empty() ? "" : "; ", hint);
}

}  // namespace cobalt
