// The environment variables the library reads (COBALT_CPU_KERNEL, COBALT_MEMORY_LIMIT), read once
// when the library is loaded and again by reload_environment(), never during a computation.
//
// glibc's getenv takes no lock, so reading the environment while another thread changes it
// (Python's os.environ, setenv) can crash; the library's worker and background planning threads
// would do exactly that if they read it. The snapshot is read under a mutex; a program that changes
// these variables after it has loaded the library calls reload_environment() afterwards, from a
// thread that may read the environment (in Python: cobalt.reload_environment(), which holds the
// GIL, as os.environ's writes do).
#pragma once

#include <optional>
#include <string>

namespace cobalt {

struct EnvironmentSettings {
  std::optional<std::string> cpu_kernel;    // COBALT_CPU_KERNEL (assign/node_cover.hpp)
  std::optional<std::string> memory_limit;  // COBALT_MEMORY_LIMIT (core/memory.hpp)
};

// A copy of the snapshot (unset variables are nullopt). Thread-safe.
EnvironmentSettings environment_settings();

// Reads the variables again into the snapshot. Thread-safe with respect to environment_settings();
// like getenv itself it must not run while another thread changes the environment.
void reload_environment();

}  // namespace cobalt
