#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.hpp"

namespace cobalt::cli {

Progress::Progress(std::string label, int64_t total) : label_(std::move(label)), total_(total) {
  const char* env = std::getenv("COBALT_PROGRESS");
  enabled_ = env ? std::string(env) == "1" : isatty(STDERR_FILENO) != 0;
}

void Progress::advance(int64_t amount) {
  done_ += amount;
  if (!enabled_ || total_ <= 0) return;
  const int percent = static_cast<int>(100 * done_ / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int filled = percent / 5;
  fmt::print(stderr, "\r{} [{}{}] {:3d}%", label_, std::string(filled, '#'),
             std::string(20 - filled, '.'), percent);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && last_percent_ >= 0) fmt::print(stderr, "\n");
  last_percent_ = -1;
}

}  // namespace cobalt::cli
