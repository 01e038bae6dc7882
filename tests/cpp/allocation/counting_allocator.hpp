// Counts the heap allocations made through operator new, by every thread of the process, while a
// CountAllocations is alive. The test binary that links counting_allocator.cpp replaces the global
// operator new and delete (malloc and free underneath); the over-aligned forms are not replaced
// and are not counted. One CountAllocations at a time.
#pragma once

#include <cstdint>

namespace cobalt::testing {

struct AllocationTally {
  int64_t allocations = 0;
  int64_t bytes = 0;  // requested, summed over the allocations
};

class CountAllocations {
 public:
  CountAllocations();  // starts counting from zero
  ~CountAllocations();
  CountAllocations(const CountAllocations&) = delete;
  CountAllocations& operator=(const CountAllocations&) = delete;

  // What was allocated since construction.
  AllocationTally tally() const;
};

}  // namespace cobalt::testing
