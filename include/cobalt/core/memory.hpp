// Up-front memory checks: an allocation sized by the input (E x E co-activation matrices,
// per-source tables) is refused with a one-line error naming what needs how much, instead of
// failing deep inside an allocator or being killed by the kernel's OOM killer after overcommit.
#pragma once

#include <string_view>

namespace cobalt {

// Memory this process may use in bytes: the machine's physical memory (sysconf), or the cgroup v2
// limit (/sys/fs/cgroup/memory.max) when lower; 0 when unknown.
double physical_memory_bytes();

// Throws cobalt::Error(kFailedPrecondition) "WHAT needs X GiB (...); this machine has Y GiB of
// memory" when `bytes` exceeds the machine's physical memory. Does nothing when it is unknown.
void require_memory(double bytes, std::string_view what);

}  // namespace cobalt
