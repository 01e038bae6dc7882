// Internal: adds the wall time of a scope, in milliseconds, to a counter.
#pragma once

#include <chrono>

namespace cobalt::policy {

class WallTimer {
 public:
  explicit WallTimer(double& total_ms)
      : total_ms_(total_ms), start_(std::chrono::steady_clock::now()) {}
  ~WallTimer() {
    total_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count();
  }

 private:
  double& total_ms_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cobalt::policy
