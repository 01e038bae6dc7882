#include "cobalt/core/environment.hpp"

#include <cstdlib>
#include <mutex>

namespace cobalt {
namespace {

std::optional<std::string> read_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

EnvironmentSettings read_environment() {
  return {read_variable("COBALT_CPU_KERNEL"), read_variable("COBALT_MEMORY_LIMIT")};
}

struct Snapshot {
  std::mutex mutex;
  EnvironmentSettings settings = read_environment();
};

Snapshot& snapshot() {
  // Never destroyed: a thread still inside a call at process exit may read it.
  static Snapshot* const instance = new Snapshot;
  return *instance;
}

// Taken when the library is loaded (static initialisation, before main or when a module that
// links it is imported), so that no later first use on a worker thread reads the environment.
[[maybe_unused]] const bool kReadAtLoad = (snapshot(), true);

}  // namespace

EnvironmentSettings environment_settings() {
  Snapshot& s = snapshot();
  std::lock_guard lock(s.mutex);
  return s.settings;
}

void reload_environment() {
  EnvironmentSettings fresh = read_environment();
  Snapshot& s = snapshot();
  std::lock_guard lock(s.mutex);
  s.settings = std::move(fresh);
}

}  // namespace cobalt
