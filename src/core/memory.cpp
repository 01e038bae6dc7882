#include "cobalt/core/memory.hpp"

#include <unistd.h>

#include <exception>
#include <fstream>
#include <string>

#include "cobalt/core/error.hpp"

namespace cobalt {

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

void require_memory(double bytes, std::string_view what) {
  const double available = physical_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  COBALT_CHECK(available <= 0 || bytes <= available, kFailedPrecondition,
               "{} needs {:.1f} GiB; this machine has {:.1f} GiB of memory", what, bytes / kGiB,
               available / kGiB);
}

}  // namespace cobalt
