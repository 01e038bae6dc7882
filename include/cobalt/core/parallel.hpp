// Deterministic data parallelism: split [0, n) into contiguous chunks, one per thread. Chunk
// boundaries depend only on (n, num_chunks), so per-chunk partial results reduced in chunk order
// give identical results for any thread count as long as the reduction is exact (integers) or the
// caller fixes num_chunks independently of the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt {

// Refuses a negative thread count (kInvalidArgument naming `what`); 0 means one per core.
inline void check_threads(int num_threads, const char* what) {
  COBALT_CHECK_ARG(num_threads >= 0, "{}: threads {} must be >= 0 (0 = one per core)", what,
                   num_threads);
}

// Resolves a requested thread count: 0 => hardware concurrency (>= 1).
inline int resolve_threads(int num_threads) {
  if (num_threads > 0) return num_threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Calls fn(chunk_idx, begin, end) for num_chunks contiguous chunks of [0, n), running up to
// num_threads at a time. Exceptions from any chunk are rethrown (the first by chunk order).
template <typename Fn>
void parallel_chunks(int64_t n, int num_chunks, int num_threads, Fn&& fn) {
  num_chunks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_chunks, n)));
  auto bounds = [&](int c) { return n * c / num_chunks; };
  num_threads = std::min(resolve_threads(num_threads), num_chunks);
  if (num_threads <= 1) {
    for (int c = 0; c < num_chunks; ++c) fn(c, bounds(c), bounds(c + 1));
    return;
  }
  std::vector<std::exception_ptr> errors(num_chunks);
  auto work = [&](int w) {
    for (int c = w; c < num_chunks; c += num_threads) {
      try {
        fn(c, bounds(c), bounds(c + 1));
      } catch (...) {
        errors[c] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(num_threads);
  int started = 0;
  try {
    for (; started < num_threads; ++started) workers.emplace_back(work, started);
  } catch (const std::system_error&) {
    // No more threads (a thread or process limit): this thread runs the workers that did not
    // start (the same chunks, so the same results); the started ones must still be joined, as a
    // joinable std::thread destroyed would terminate the process.
  }
  for (int w = started; w < num_threads; ++w) work(w);
  for (auto& t : workers) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace cobalt
