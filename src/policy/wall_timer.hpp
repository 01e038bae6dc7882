// Internal: adds the wall time of a scope, in milliseconds, to a counter.
#pragma once

#include <time.h>

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

// Internal: adds the CPU time the calling thread spends in a scope, in milliseconds, to a counter.
// For work on a background thread: its wall time on a shared machine also counts the threads it
// competes with, while on its own core (a training host's planner thread) it would take its CPU
// time.
class ThreadCpuTimer {
 public:
  explicit ThreadCpuTimer(double& total_ms) : total_ms_(total_ms), start_ms_(now_ms()) {}
  ~ThreadCpuTimer() { total_ms_ += now_ms() - start_ms_; }

 private:
  static double now_ms() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
  }
  double& total_ms_;
  double start_ms_;
};

}  // namespace cobalt::policy
