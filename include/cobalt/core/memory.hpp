// Up-front memory checks: an allocation sized by the input (E x E co-activation matrices,
// per-source tables, a whole run's statistics) is refused with a one-line error naming what needs
// how much, instead of failing deep inside an allocator or being killed by the kernel's OOM killer
// after overcommit.
#pragma once

#include <string>
#include <string_view>

namespace cobalt {

// Memory this process may use in bytes: the machine's physical memory (sysconf), or the cgroup v2
// limit (/sys/fs/cgroup/memory.max) when lower; 0 when unknown.
double physical_memory_bytes();

// The share of physical_memory_bytes() the checks allow by default (the rest is left to the
// system, the page cache and what the estimates leave out).
inline constexpr double kMemoryBudgetShare = 0.75;

// The budget the checks compare against: the environment variable COBALT_MEMORY_LIMIT when set (a
// byte count, or a number with a K, M, G or T suffix in powers of 1024, e.g. "512M", "2.5G"; at
// least 1 KiB), else
// kMemoryBudgetShare x physical_memory_bytes(); 0 when unknown (no check). Throws
// cobalt::Error(kInvalidArgument) when COBALT_MEMORY_LIMIT is set but is not such a size. The
// variable is read when the library loads and by reload_environment() (core/environment.hpp).
double memory_budget_bytes();

// "1.5 GiB", "640 MiB", "12 KiB": a byte count for messages.
std::string format_bytes(double bytes);

// Throws cobalt::Error(kFailedPrecondition) "WHAT needs X GiB, above the memory budget of Y GiB
// (75% of this machine's Z GiB of memory; COBALT_MEMORY_LIMIT sets another)[; HINT]" when `bytes`
// exceeds memory_budget_bytes(). Does nothing when the budget is unknown. `hint` says what to
// lower.
void require_memory(double bytes, std::string_view what, std::string_view hint = {});

}  // namespace cobalt
