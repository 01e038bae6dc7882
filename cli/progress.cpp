#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.hpp"

namespace cobalt::cli {

void write_stderr(std::string_view text) noexcept {
  if (std::fwrite(text.data(), 1, text.size(), stderr) != text.size()) std::clearerr(stderr);
  std::fflush(stderr);
}

Progress::Progress(std::string label, int64_t total) : label_(std::move(label)), total_(total) {
  const char* env = std::getenv("COBALT_PROGRESS");
  enabled_ = env ? std::string(env) == "1" : isatty(STDERR_FILENO) != 0;
}

void Progress::advance(int64_t amount) {
  done_ += amount;
  if (!enabled_ || total_ <= 0) return;
  // Clamped to [0, 100]: a caller that reports more (or less) work than it announced must not
  // make the bar longer than its 20 cells (or shorter than none).
  const double fraction =
      std::clamp(static_cast<double>(done_) / static_cast<double>(total_), 0.0, 1.0);
  const int percent = static_cast<int>(100 * fraction);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int filled = std::clamp(percent / 5, 0, 20);
  write_stderr(fmt::format("\r{} [{}{}] {:3d}%", label_, std::string(filled, '#'),
                           std::string(20 - filled, '.'), percent));
}

void Progress::finish() {
  if (enabled_ && last_percent_ >= 0) write_stderr("\n");
  last_percent_ = -1;
}

}  // namespace cobalt::cli
