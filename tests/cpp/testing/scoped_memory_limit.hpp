// COBALT_MEMORY_LIMIT set for one scope (the earlier value restored), for tests of up-front memory
// checks (core/memory.hpp); the library's snapshot of the environment is reloaded both times.
#pragma once

#include <cstdlib>
#include <string>

#include "cobalt/core/environment.hpp"

namespace cobalt::testing {

class ScopedMemoryLimit {
 public:
  // nullptr: unset for the scope.
  explicit ScopedMemoryLimit(const char* value) {
    const char* old = std::getenv("COBALT_MEMORY_LIMIT");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      ::setenv("COBALT_MEMORY_LIMIT", value, 1);
    } else {
      ::unsetenv("COBALT_MEMORY_LIMIT");
    }
    reload_environment();
  }
  ~ScopedMemoryLimit() {
    if (had_) {
      ::setenv("COBALT_MEMORY_LIMIT", old_.c_str(), 1);
    } else {
      ::unsetenv("COBALT_MEMORY_LIMIT");
    }
    reload_environment();
  }
  ScopedMemoryLimit(const ScopedMemoryLimit&) = delete;
  ScopedMemoryLimit& operator=(const ScopedMemoryLimit&) = delete;

 private:
  bool had_ = false;
  std::string old_;
};

}  // namespace cobalt::testing
