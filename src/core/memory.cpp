#include "cobalt/core/memory.hpp"

#include <unistd.h>

#include "cobalt/core/error.hpp"

namespace cobalt {

double physical_memory_bytes() {
  static const double bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0.0;
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
