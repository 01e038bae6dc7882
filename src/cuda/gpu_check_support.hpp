// Internal to cobalt_gpu_check: CUDA error handling, device buffers, the result table's rows,
// timing with CUDA events and the bitwise comparison against CPU references.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check_inputs.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/cuda/assign.hpp"
#include "cobalt/cuda/device_layout.hpp"
#include "cobalt/cuda/dispatch_layout.hpp"
#include "cobalt/cuda/routing_stats.hpp"
#include "cobalt/cuda/topoep.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt::cuda::check {

inline constexpr unsigned char kPoison = 0xab;

// A failed CUDA call throws: inside guarded() it marks that check failed (or, when the context is
// lost, prints the table so far); elsewhere main reports it and exits with 3.
struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw CudaFailure(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
  }
}

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { resize(count); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void resize(size_t count) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = count;
    cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(1, count) * sizeof(T)), "cudaMalloc");
  }
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) resize(host.size());
    cuda_ok(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            "cudaMemcpy H2D");
    // cudaMemcpy from pageable memory may return before the device has the data: wait, so a
    // kernel on any stream sees it.
    cuda_ok(cudaDeviceSynchronize(), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cuda_ok(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
    return host;
  }
  // Fills the buffer with kPoison bytes and waits for it (cudaMemset is asynchronous for device
  // memory), so late poison can never land on a kernel's output.
  void poison() {
    cuda_ok(cudaMemset(ptr_, kPoison, count_ * sizeof(T)), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "cudaMemset");
  }
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }

 private:
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

struct Options {
  std::string traces;
  int64_t tokens = 1000000;
  int reps = 20;
  bool quick = false;
  bool timing = true;    // false: check each case once, time nothing (runs under sanitizers)
  bool dry_run = false;  // inputs and CPU references only (no CUDA call): tests this program
  // false: skip the check that makes a failing CUDA call on purpose (a launcher must refuse the
  // error it left pending); compute-sanitizer would report that call as an API error.
  bool injected_errors = true;
  std::string csv;
};

struct Row {
  std::string kernel, input, shape;
  int64_t mismatches = -1;  // -1: not checked
  std::string note;
  double cpu_ms = -1;  // CPU reference, one thread
  double median_us = -1, min_us = -1;
  double graph_us = -1;  // median of the same call replayed from a CUDA graph (no launch cost)
  double bytes = 0;
};

struct Context {
  Options opt;
  cudaStream_t stream = nullptr;
  double copy_bandwidth = 0;     // bytes/s, measured
  double nominal_bandwidth = 0;  // bytes/s, from the memory clock and bus width
  std::vector<Row> rows;
  int failures = 0;
};

inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Median and minimum of `reps` timed calls (after 3 warm-ups), in microseconds.
inline void time_calls(Context& ctx, Row& row, const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();
  cuda_ok(cudaStreamSynchronize(ctx.stream), "warm-up");
  // Destroyed on every path (a failed CUDA call throws out of here and the check goes on).
  struct Events {
    std::vector<cudaEvent_t> list;
    ~Events() {
      for (auto& e : list) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  } owned{std::vector<cudaEvent_t>(2 * ctx.opt.reps, nullptr)};
  auto& events = owned.list;
  for (auto& e : events) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < ctx.opt.reps; ++i) {
    cuda_ok(cudaEventRecord(events[2 * i], ctx.stream), "cudaEventRecord");
    call();
    cuda_ok(cudaEventRecord(events[2 * i + 1], ctx.stream), "cudaEventRecord");
  }
  cuda_ok(cudaStreamSynchronize(ctx.stream), "timed calls");
  std::vector<double> us(ctx.opt.reps);
  for (int i = 0; i < ctx.opt.reps; ++i) {
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    us[i] = 1000.0 * ms;
  }
  std::sort(us.begin(), us.end());
  row.median_us = us[us.size() / 2];
  row.min_us = us.front();
}

// The call captured kGraphCalls times into one CUDA graph and the graph replayed (3 warm-ups,
// then `reps` replays timed with events), per call: what the call costs on the device when a
// training step replays it from a graph, without the host's launch latency that time_calls
// includes (several kernels per call; k calls per graph so a short call cannot leave the device
// idle between the events). Sets row.graph_us. Throws CudaFailure when the call cannot be
// captured or replayed (the caller makes that a note).
inline constexpr int kGraphCalls = 10;
inline void time_graph_replays(Context& ctx, Row& row, const std::function<void()>& call) {
  struct Graph {
    cudaStream_t stream;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::vector<cudaEvent_t> events;
    ~Graph() {
      // Never leave the stream capturing (every later call on it, or a device-wide sync, would
      // fail and read as a lost context).
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
          status != cudaStreamCaptureStatusNone) {
        cudaGraph_t partial = nullptr;
        (void)cudaStreamEndCapture(stream, &partial);
        if (partial != nullptr) cudaGraphDestroy(partial);
      }
      (void)cudaGetLastError();
      for (auto& e : events) {
        if (e != nullptr) cudaEventDestroy(e);
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  } g{ctx.stream, nullptr, nullptr, {}};
  // Thread-local mode: a launcher that made an unsafe call (an allocation, a synchronisation)
  // while capturing is refused instead of silently baking its result into the graph. The device
  // attributes the launchers query were cached by the direct calls before.
  cuda_ok(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
  try {
    for (int i = 0; i < kGraphCalls; ++i) call();
  } catch (const std::exception& e) {
    // The same call ran directly just before, so what failed is its capture.
    (void)cudaStreamEndCapture(ctx.stream, &g.graph);
    (void)cudaGetLastError();
    throw CudaFailure(std::string("during capture: ") + e.what());
  }
  cuda_ok(cudaStreamEndCapture(ctx.stream, &g.graph), "cudaStreamEndCapture");
  cuda_ok(cudaGraphInstantiate(&g.exec, g.graph, 0), "cudaGraphInstantiate");
  for (int i = 0; i < 3; ++i) cuda_ok(cudaGraphLaunch(g.exec, ctx.stream), "cudaGraphLaunch");
  g.events.assign(2 * ctx.opt.reps, nullptr);
  for (auto& e : g.events) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < ctx.opt.reps; ++i) {
    cuda_ok(cudaEventRecord(g.events[2 * i], ctx.stream), "cudaEventRecord");
    cuda_ok(cudaGraphLaunch(g.exec, ctx.stream), "cudaGraphLaunch");
    cuda_ok(cudaEventRecord(g.events[2 * i + 1], ctx.stream), "cudaEventRecord");
  }
  cuda_ok(cudaStreamSynchronize(ctx.stream), "graph replays");
  std::vector<double> us(ctx.opt.reps);
  for (int i = 0; i < ctx.opt.reps; ++i) {
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, g.events[2 * i], g.events[2 * i + 1]),
            "cudaEventElapsedTime");
    us[i] = 1000.0 * ms / kGraphCalls;
  }
  std::sort(us.begin(), us.end());
  row.graph_us = us[us.size() / 2];
}

// One checked call (outputs poisoned by the caller), then, when timed, the timing loop, the graph
// replays and a second comparison of the last replay's outputs. compare() synchronises and
// returns mismatches. A graph that cannot be captured or replayed is a note, not a failure, unless
// the context is lost (then the error goes on to guarded()).
template <typename Call, typename Compare>
void check_then_time(Context& ctx, Row& row, const Call& call, const Compare& compare, bool timed) {
  call();
  row.mismatches = compare();
  if (timed && ctx.opt.timing) {
    time_calls(ctx, row, call);
    try {
      time_graph_replays(ctx, row, call);
    } catch (const CudaFailure& e) {
      if (cudaDeviceSynchronize() != cudaSuccess) throw;
      (void)cudaGetLastError();
      row.graph_us = -1;
      row.note += std::string(row.note.empty() ? "" : "; ") + "no graph timing: " + e.what();
    }
    row.mismatches += compare();
  }
}

template <typename T>
int64_t count_mismatches(const std::vector<T>& gpu, const std::vector<T>& cpu, const char* what) {
  if (gpu.size() != cpu.size()) {
    std::fprintf(stderr, "  %s: size %zu vs %zu\n", what, gpu.size(), cpu.size());
    return static_cast<int64_t>(std::max(gpu.size(), cpu.size()));
  }
  int64_t bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(T)) != 0) {
      if (bad < 3) {
        std::fprintf(stderr, "  %s[%zu]: gpu %lld cpu %lld\n", what, i,
                     static_cast<long long>(gpu[i]), static_cast<long long>(cpu[i]));
      }
      ++bad;
    }
  }
  return bad;
}

// The CUDA context is unusable (a sticky error such as an illegal address): no further check can
// run; the caller prints what it has.
struct ContextLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs the GPU part of one check. An exception (a launcher's cobalt::Error, a failed CUDA call)
// marks the row failed with the error as its note and lets the remaining checks run, unless the
// context is lost afterwards: then the row is recorded and ContextLost thrown.
inline void finish(Context& ctx, Row row, bool print = true);
template <typename GpuPart>
void guarded(Context& ctx, Row& row, GpuPart&& gpu_part) {
  try {
    gpu_part();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "  %s %s: %s\n", row.kernel.c_str(), row.input.c_str(), e.what());
    row.mismatches = std::max<int64_t>(row.mismatches, 1);
    row.note = std::string("error: ") + e.what() + (row.note.empty() ? "" : "; " + row.note);
    const cudaError_t sticky = cudaDeviceSynchronize();
    (void)cudaGetLastError();  // clear a non-sticky error
    if (sticky != cudaSuccess) {
      finish(ctx, row);
      throw ContextLost(cudaGetErrorString(sticky));
    }
  }
}

inline void finish(Context& ctx, Row row, bool print) {
  if (row.mismatches > 0) ++ctx.failures;
  if (!print) {
    if (row.mismatches > 0)
      std::printf("  %s %s: MISMATCH\n", row.kernel.c_str(), row.input.c_str());
    ctx.rows.push_back(std::move(row));
    return;
  }
  std::printf("  %-9s %-28s %-26s %s\n", row.kernel.c_str(), row.input.c_str(), row.shape.c_str(),
              ctx.opt.dry_run       ? "(dry run)"
              : row.mismatches < 0  ? "-"
              : row.mismatches == 0 ? "ok"
                                    : "MISMATCH");
  std::fflush(stdout);
  ctx.rows.push_back(std::move(row));
}

}  // namespace cobalt::cuda::check
