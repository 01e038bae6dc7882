// cobalt_gpu_check: checks every CUDA kernel against its CPU reference and times it.
//
//   cobalt_gpu_check [--traces DIR] [--tokens N] [--reps N] [--quick] [--dry-run] [--csv FILE]
//
// --dry-run builds the inputs and runs the CPU references only (no CUDA call), to test this
// program where there is no GPU.
// Correctness: each checked run writes into outputs pre-filled with a poison byte pattern, copies
// them back and compares every element with the CPU reference (bitwise; integers only), so an
// element the kernel fails to write is caught. Timing: CUDA events around each call on one stream,
// after 3 warm-up calls; the median and minimum of --reps calls. The floor is the bytes the call
// must move (inputs read once, outputs written once) over the device-to-device copy bandwidth
// measured at start-up (read + write bytes / time), the best a memory-bound kernel can do.
// Prints one table; exit status 1 if any check failed, 2 without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
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
namespace {

constexpr unsigned char kPoison = 0xab;

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(status));
    std::exit(3);
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
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cuda_ok(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
    return host;
  }
  void poison() { cuda_ok(cudaMemset(ptr_, kPoison, count_ * sizeof(T)), "cudaMemset"); }
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
  bool dry_run = false;  // inputs and CPU references only (no CUDA call): tests this program
  std::string csv;
};

struct Row {
  std::string kernel, input, shape;
  int64_t mismatches = -1;  // -1: not checked
  std::string note;
  double cpu_ms = -1;  // CPU reference, one thread
  double median_us = -1, min_us = -1;
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

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Median and minimum of `reps` timed calls (after 3 warm-ups), in microseconds.
void time_calls(Context& ctx, Row& row, const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();
  cuda_ok(cudaStreamSynchronize(ctx.stream), "warm-up");
  std::vector<cudaEvent_t> events(2 * ctx.opt.reps);
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
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  row.median_us = us[us.size() / 2];
  row.min_us = us.front();
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

void finish(Context& ctx, Row row, bool print = true) {
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

// --- Assignment
// ------------------------------------------------------------------------------------

const char* search_name(assign::CoverSearch s) {
  return s == assign::CoverSearch::kMaskEnumeration ? "masks"
         : s == assign::CoverSearch::kSubsetDp      ? "subset-dp"
                                                    : "auto";
}

// Runs and checks the assignment; returns the CPU result (exec ranks) for later kernels.
std::vector<int32_t> check_assign(Context& ctx, const Batch& b, const ExpertLayout& layout,
                                  assign::CoverSearch search, bool timed, int64_t token_offset = 0,
                                  bool misaligned = false) {
  Row row;
  row.kernel = "assign";
  row.input = b.name + (misaligned ? " (misaligned)" : "") + (token_offset ? " (offset)" : "");
  row.shape = std::to_string(layout.num_nodes()) + "x" +
              std::to_string(layout.topology().ranks_per_node()) + " E" +
              std::to_string(b.num_experts) + " K" + std::to_string(b.top_k) + " T" +
              std::to_string(b.num_tokens()) + " " + search_name(search);
  const assign::AssignKey key{12345, 7, 3, token_offset};
  std::vector<RankId> cpu(b.ids.size());
  const double t0 = now_ms();
  assign::assign_node_cover(b.view(), layout, key, {search, 1}, cpu);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 4.0 * b.num_tokens() * (2 * b.top_k + 1);
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row));
    return cpu;
  }

  const DeviceLayout dlayout(layout, ctx.stream);
  const size_t pad = misaligned ? 1 : 0;
  DeviceBuffer<int32_t> ids(b.ids.size() + pad), src(b.src.size()), exec(b.ids.size() + pad);
  cuda_ok(cudaMemcpy(ids.get() + pad, b.ids.data(), b.ids.size() * 4, cudaMemcpyHostToDevice),
          "upload ids");
  src.upload(b.src);
  const size_t ws_bytes =
      assign_workspace_bytes(b.num_tokens(), b.top_k, layout.num_nodes(), search);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto call = [&] {
    assign_node_cover(dlayout.view(), ids.get() + pad, src.get(), b.num_tokens(), b.top_k, key,
                      search, exec.get() + pad, ws.get(), ws_bytes, ctx.stream);
  };
  exec.poison();
  call();
  cuda_ok(cudaStreamSynchronize(ctx.stream), "assign");
  std::vector<int32_t> gpu(b.ids.size());
  cuda_ok(cudaMemcpy(gpu.data(), exec.get() + pad, gpu.size() * 4, cudaMemcpyDeviceToHost),
          "download exec");
  row.mismatches = count_mismatches(gpu, cpu, "exec_rank");
  if (search == assign::CoverSearch::kMaskEnumeration && layout.num_nodes() <= 12 &&
      b.num_tokens() <= 200000) {
    std::vector<RankId> ref(b.ids.size());
    assign::assign_node_cover_reference(b.view(), layout, key, ref);
    row.mismatches += count_mismatches(gpu, ref, "exec_rank vs reference");
  }
  if (timed) time_calls(ctx, row, call);
  finish(ctx, std::move(row));
  return cpu;
}

// --- Routing statistics
// ----------------------------------------------------------------------------

const char* method_name(StatsMethod m) {
  switch (m) {
    case StatsMethod::kAuto:
      return "auto";
    case StatsMethod::kSharedAggregated:
      return "shared+aggregated";
    case StatsMethod::kSharedPlain:
      return "shared plain";
    case StatsMethod::kGlobalAggregated:
      return "global+aggregated";
  }
  return "?";
}

void check_stats(Context& ctx, const Batch& b, std::vector<StatsMethod> methods, bool timed) {
  const int E = b.num_experts;
  std::vector<int64_t> loads(E), coact(static_cast<size_t>(E) * E);
  const double t0 = now_ms();
  count_routing(b.view(), loads, coact, 1);
  const double cpu_ms = now_ms() - t0;
  if (ctx.opt.dry_run) {
    Row row;
    row.kernel = "stats";
    row.input = b.name;
    row.shape = "E" + std::to_string(E) + " K" + std::to_string(b.top_k) + " T" +
                std::to_string(b.num_tokens());
    row.cpu_ms = cpu_ms;
    row.bytes = 4.0 * b.num_tokens() * b.top_k + 8.0 * (E + static_cast<double>(E) * E);
    finish(ctx, std::move(row));
    return;
  }
  DeviceBuffer<int32_t> ids;
  ids.upload(b.ids);
  DeviceBuffer<int64_t> d_loads(E), d_coact(static_cast<size_t>(E) * E);
  for (StatsMethod method : methods) {
    if (!routing_counts_supported(E, method)) continue;
    Row row;
    row.kernel = "stats";
    row.input = b.name;
    row.shape = "E" + std::to_string(E) + " K" + std::to_string(b.top_k) + " T" +
                std::to_string(b.num_tokens()) + " " + method_name(method);
    row.cpu_ms = cpu_ms;
    const size_t ws_bytes = routing_counts_workspace_bytes(b.num_tokens(), b.top_k, E, method);
    DeviceBuffer<unsigned char> ws(ws_bytes);
    auto call = [&] {
      count_routing(ids.get(), b.num_tokens(), b.top_k, E, d_loads.get(), d_coact.get(), ws.get(),
                    ws_bytes, ctx.stream, method);
    };
    d_loads.poison();
    d_coact.poison();
    call();
    cuda_ok(cudaStreamSynchronize(ctx.stream), "count_routing");
    row.mismatches = count_mismatches(d_loads.download(), loads, "expert_counts") +
                     count_mismatches(d_coact.download(), coact, "coactivation");
    row.bytes = 4.0 * b.num_tokens() * b.top_k + 8.0 * (E + static_cast<double>(E) * E);
    if (timed) time_calls(ctx, row, call);
    finish(ctx, std::move(row));
  }
}

// --- Dispatch layout
// -------------------------------------------------------------------------------

void check_dispatch(Context& ctx, const Batch& b, const std::vector<int32_t>& exec,
                    const Topology& topo, bool timed, bool optional_outputs = true) {
  const int G = topo.num_ranks(), N = topo.num_nodes();
  const int64_t T = b.num_tokens();
  Row row;
  row.kernel = "dispatch";
  row.input = b.name;
  row.shape = std::to_string(N) + "x" + std::to_string(topo.ranks_per_node()) + " K" +
              std::to_string(b.top_k) + " T" + std::to_string(T) +
              (optional_outputs ? " all outputs" : " counts+offsets");
  const double t0 = now_ms();
  const auto cpu = assign::dispatch_layout(exec, b.src, b.top_k, topo);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 4.0 * T * b.top_k + 8.0 * (2 * G + N + 1);
  if (optional_outputs) row.bytes += 4.0 * T + 4.0 * T * b.top_k + 1.0 * T * G + 8.0 * G * G;
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row));
    return;
  }
  DeviceBuffer<int32_t> d_exec, d_src;
  d_exec.upload(exec);
  d_src.upload(b.src);
  DeviceBuffer<int64_t> rank_counts(G), node_counts(N), rank_offsets(G + 1),
      pair_counts(static_cast<size_t>(G) * G);
  DeviceBuffer<int32_t> slot(exec.size());
  DeviceBuffer<uint8_t> token_in_rank(static_cast<size_t>(T) * G);
  DispatchLayoutOutputs out;
  out.rank_counts = rank_counts.get();
  out.node_counts = node_counts.get();
  out.rank_offsets = rank_offsets.get();
  if (optional_outputs) {
    out.slot = slot.get();
    out.token_in_rank = token_in_rank.get();
    out.pair_counts = pair_counts.get();
  }
  const size_t ws_bytes = dispatch_layout_workspace_bytes(T, G);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto call = [&] {
    dispatch_layout(d_exec.get(), d_src.get(), T, b.top_k, N, G, out, ws.get(), ws_bytes,
                    ctx.stream);
  };
  rank_counts.poison();
  node_counts.poison();
  rank_offsets.poison();
  pair_counts.poison();
  slot.poison();
  token_in_rank.poison();
  call();
  cuda_ok(cudaStreamSynchronize(ctx.stream), "dispatch_layout");
  row.mismatches = count_mismatches(rank_counts.download(), cpu.rank_counts, "rank_counts") +
                   count_mismatches(node_counts.download(), cpu.node_counts, "node_counts") +
                   count_mismatches(rank_offsets.download(), cpu.rank_offsets, "rank_offsets");
  if (optional_outputs) {
    row.mismatches +=
        count_mismatches(pair_counts.download(), cpu.pair_counts, "pair_counts") +
        count_mismatches(slot.download(), cpu.slot, "slot") +
        count_mismatches(token_in_rank.download(), cpu.token_in_rank, "token_in_rank");
  }
  if (timed) time_calls(ctx, row, call);
  finish(ctx, std::move(row));
}

// --- TopoEP
// ----------------------------------------------------------------------------------------

void check_topoep(Context& ctx, const std::string& name, const plan::TopoEpInput& in, bool timed,
                  bool print = true) {
  const int G = in.topology.num_ranks(), E = in.num_experts, S = in.slots_per_rank;
  Row row;
  row.kernel = "topoep";
  row.input = name;
  row.shape = std::to_string(in.topology.num_nodes()) + "x" +
              std::to_string(in.topology.ranks_per_node()) + " E" + std::to_string(E) + " S" +
              std::to_string(S);
  const double t0 = now_ms();
  const plan::TopoEpPlan cpu = plan::solve_topoep(in);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 8.0 * G * E + 4.0 * G * S + 16.0 * cpu.quotas.size() + 8.0 * (2 * G + 1);
  if (ctx.opt.dry_run) {
    row.note = std::to_string(cpu.quotas.size()) + " quotas, " +
               std::to_string(cpu.stats.num_inter_node_replicas) + "+" +
               std::to_string(cpu.stats.num_intra_node_replicas) + " replicas, " +
               std::to_string(cpu.stats.num_refinement_moves) + " moves";
    finish(ctx, std::move(row), print);
    return;
  }
  DeviceBuffer<int64_t> demand;
  demand.upload(std::vector<int64_t>(in.demand.begin(), in.demand.end()));
  TopoEpDeviceInput din;
  din.num_nodes = in.topology.num_nodes();
  din.num_ranks = G;
  din.num_experts = E;
  din.slots_per_rank = S;
  din.token_bytes = in.token_bytes;
  din.expert_param_bytes = in.expert_param_bytes;
  din.demand = demand.get();
  const int64_t capacity = topoep_quota_capacity(G, S);
  DeviceBuffer<int32_t> slots(static_cast<size_t>(G) * S), status(1);
  DeviceBuffer<int64_t> offsets(G + 1), loads(G), stats(4);
  DeviceBuffer<TopoEpDeviceQuota> quotas(static_cast<size_t>(capacity));
  TopoEpDeviceOutput out;
  out.slots = slots.get();
  out.source_offsets = offsets.get();
  out.quotas = quotas.get();
  out.quota_capacity = capacity;
  out.rank_loads = loads.get();
  out.stats = stats.get();
  out.status = status.get();
  const size_t ws_bytes = topoep_workspace_bytes(din);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ws.poison();  // the solver must not read workspace it did not write
  auto call = [&] { solve_topoep(din, out, ws.get(), ws_bytes, ctx.stream); };
  slots.poison();
  offsets.poison();
  loads.poison();
  stats.poison();
  status.poison();
  quotas.poison();
  call();
  cuda_ok(cudaStreamSynchronize(ctx.stream), "solve_topoep");
  const int32_t code = status.download()[0];
  row.mismatches = code != 0 ? 1 : 0;
  if (code != 0) std::fprintf(stderr, "  topoep status %d\n", code);
  row.mismatches += count_mismatches(slots.download(), cpu.slots, "slots") +
                    count_mismatches(offsets.download(), cpu.source_offsets, "source_offsets") +
                    count_mismatches(loads.download(), cpu.rank_loads, "rank_loads");
  const auto st = stats.download();
  const std::vector<int64_t> cpu_stats = {
      cpu.stats.num_inter_node_replicas, cpu.stats.num_intra_node_replicas,
      cpu.stats.num_refinement_moves, cpu.stats.num_dropped_replicas};
  row.mismatches += count_mismatches(st, cpu_stats, "stats");
  auto gq = quotas.download();
  gq.resize(std::min<size_t>(gq.size(), cpu.quotas.size()));
  int64_t bad_quotas = gq.size() == cpu.quotas.size() ? 0 : 1;
  for (size_t i = 0; i < gq.size(); ++i) {
    if (gq[i].expert != cpu.quotas[i].expert || gq[i].dst != cpu.quotas[i].dst ||
        gq[i].count != cpu.quotas[i].count) {
      if (bad_quotas < 3) {
        std::fprintf(stderr, "  quota %zu: gpu (%d,%d,%lld) cpu (%d,%d,%lld)\n", i, gq[i].expert,
                     gq[i].dst, static_cast<long long>(gq[i].count), cpu.quotas[i].expert,
                     cpu.quotas[i].dst, static_cast<long long>(cpu.quotas[i].count));
      }
      ++bad_quotas;
    }
  }
  row.mismatches += bad_quotas;
  row.note = std::to_string(cpu.quotas.size()) + " quotas, " +
             std::to_string(cpu.stats.num_inter_node_replicas) + "+" +
             std::to_string(cpu.stats.num_intra_node_replicas) + " replicas, " +
             std::to_string(cpu.stats.num_refinement_moves) + " moves";
  if (timed) time_calls(ctx, row, call);
  finish(ctx, std::move(row), print);
}

plan::TopoEpInput topoep_input(const Topology& topo, int experts, int extra, double token_bytes,
                               double param_bytes, const std::vector<int64_t>& demand) {
  plan::TopoEpInput in;
  in.topology = topo;
  in.num_experts = experts;
  in.slots_per_rank = (experts + topo.num_ranks() - 1) / topo.num_ranks() + extra;
  in.token_bytes = token_bytes;
  in.expert_param_bytes = param_bytes;
  in.demand = demand;
  return in;
}

// --- Driver
// ----------------------------------------------------------------------------------------

void measure_bandwidth(Context& ctx) {
  int device = 0, clock_khz = 0, bus_bits = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) {
    ctx.nominal_bandwidth = 2.0 * clock_khz * 1e3 * bus_bits / 8;  // double data rate
  }
  (void)cudaGetLastError();
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<unsigned char> a(bytes), b(bytes);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, ctx.stream);
    cuda_ok(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, ctx.stream),
            "cudaMemcpyAsync D2D");
    cudaEventRecord(stop, ctx.stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) times.push_back(ms);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  std::sort(times.begin(), times.end());
  ctx.copy_bandwidth = 2.0 * bytes / (times[times.size() / 2] * 1e-3);
}

int run_cases(Context& ctx);

void print_table(const Context& ctx) {
  std::printf("\n%-9s %-28s %-34s %-8s %9s %10s %10s %9s %7s  %s\n", "kernel", "input", "shape",
              "check", "cpu_ms", "median_us", "min_us", "floor_us", "xfloor", "note");
  for (const Row& r : ctx.rows) {
    const double floor_us = r.bytes / ctx.copy_bandwidth * 1e6;
    char timing[96] = "";
    if (r.median_us >= 0) {
      std::snprintf(timing, sizeof timing, "%10.1f %10.1f %9.2f %7.2f", r.median_us, r.min_us,
                    floor_us, r.median_us / floor_us);
    } else {
      std::snprintf(timing, sizeof timing, "%10s %10s %9.2f %7s", "-", "-", floor_us, "-");
    }
    std::printf("%-9s %-28s %-34s %-8s %9.2f %s  %s\n", r.kernel.c_str(), r.input.c_str(),
                r.shape.c_str(),
                r.mismatches < 0    ? "-"
                : r.mismatches == 0 ? "ok"
                                    : "FAIL",
                r.cpu_ms, timing, r.note.c_str());
  }
  if (!ctx.opt.csv.empty()) {
    if (FILE* f = std::fopen(ctx.opt.csv.c_str(), "w")) {
      std::fprintf(f, "kernel,input,shape,check,cpu_ms,median_us,min_us,floor_us,bytes,note\n");
      for (const Row& r : ctx.rows) {
        std::fprintf(f, "%s,%s,%s,%s,%.3f,%.2f,%.2f,%.3f,%.0f,%s\n", r.kernel.c_str(),
                     r.input.c_str(), r.shape.c_str(),
                     r.mismatches < 0    ? "-"
                     : r.mismatches == 0 ? "ok"
                                         : "FAIL",
                     r.cpu_ms, r.median_us, r.min_us, r.bytes / ctx.copy_bandwidth * 1e6, r.bytes,
                     r.note.c_str());
      }
      std::fclose(f);
    }
  }
}

int run(const Options& opt) {
  Context ctx;
  ctx.opt = opt;
  if (opt.dry_run) {
    std::printf("dry run: inputs and CPU references only, no CUDA call, nothing checked\n\n");
    ctx.copy_bandwidth = 4.3e12;  // only to fill the floor column (H200 D2D copy, not measured)
    return run_cases(ctx);
  }
  if (!device_available()) {
    std::printf("cobalt_gpu_check: no CUDA device visible; nothing checked\n");
    return 2;
  }
  cuda_ok(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaDeviceProp prop{};
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  cuda_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  measure_bandwidth(ctx);
  std::printf("device: %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30), driver, runtime);
  std::printf("memory bandwidth: %.0f GB/s measured (D2D copy, read+write), %.0f GB/s nominal\n",
              ctx.copy_bandwidth / 1e9, ctx.nominal_bandwidth / 1e9);
  std::printf("tokens %lld, %d timed reps after 3 warm-ups, host threads %u\n\n",
              static_cast<long long>(opt.tokens), opt.reps, std::thread::hardware_concurrency());
  const int status = run_cases(ctx);
  cudaStreamDestroy(ctx.stream);
  return status;
}

int run_cases(Context& ctx) {
  const Options& opt = ctx.opt;

  const int64_t T = opt.quick ? std::min<int64_t>(opt.tokens, 100000) : opt.tokens;
  using assign::CoverSearch;

  // 1. Assignment: the target shape (4 nodes, K = 8), skewed random and a preset, then
  // the scalable variant over 16 nodes, then small shapes and edge cases (check only).
  const Topology t4x8(4, 32), t16x8(16, 128);
  const auto layout4 = random_layout(1, t4x8, 256, 12, 0.8);  // rho = 0.5: S = 1.5 * 256 / 32
  const Batch rnd = random_batch(2, T, 8, 256, 32, 1.0);
  const auto exec4 = check_assign(ctx, rnd, layout4, CoverSearch::kAuto, true);
  check_assign(ctx, rnd, layout4, CoverSearch::kSubsetDp, true);
  const Batch realistic = preset_batch("realistic", T, 32, 5);
  const auto layout_r =
      random_layout(3, t4x8, realistic.num_experts, (3 * realistic.num_experts) / (2 * 32), 0.8);
  const auto exec_r = check_assign(ctx, realistic, layout_r, CoverSearch::kAuto, true);
  const auto layout16 = random_layout(4, t16x8, 512, 6, 0.8);
  const Batch rnd16 = random_batch(6, T, 8, 512, 128, 1.0);
  const auto exec16 = check_assign(ctx, rnd16, layout16, CoverSearch::kAuto, true);
  {
    struct Small {
      int nodes, per_node, experts, top_k, slots;
    };
    uint64_t seed = 100;
    for (const Small c : {Small{1, 4, 16, 4, 6}, Small{2, 4, 32, 2, 6}, Small{3, 2, 24, 3, 6},
                          Small{5, 2, 40, 6, 6}, Small{8, 2, 64, 8, 6}, Small{8, 1, 40, 1, 8},
                          Small{12, 2, 96, 8, 6}, Small{20, 1, 80, 5, 6}}) {
      const Topology topo(c.nodes, c.nodes * c.per_node);
      const auto layout = random_layout(++seed, topo, c.experts, c.slots, 0.5);
      ++seed;
      const Batch b =
          random_batch(seed, 20011, c.top_k, c.experts, topo.num_ranks(), 1.0, seed % 2 == 0);
      for (auto search : {CoverSearch::kMaskEnumeration, CoverSearch::kSubsetDp}) {
        check_assign(ctx, b, layout, search, false);
      }
    }
    // Token offset (a later slice of a step) and rows that are not 16-byte aligned.
    const Batch b = random_batch(7, 50000, 8, 256, 32, 1.0);
    check_assign(ctx, b, layout4, CoverSearch::kAuto, false, 777);
    check_assign(ctx, b, layout4, CoverSearch::kAuto, false, 0, true);
    // K = 16 over 64 nodes: subset DPs larger than the per-thread table (the deferred pass).
    const Topology t64(64, 64);
    const auto layout64 = random_layout(8, t64, 256, 5, 0.9);
    Batch wide = random_batch(9, 1000, 16, 256, 64, 0.0, false);
    wide.name = "random K16";
    check_assign(ctx, wide, layout64, CoverSearch::kSubsetDp, false);
  }
  std::vector<Batch> traces;
  std::vector<std::vector<int32_t>> trace_exec;
  if (!opt.traces.empty() && std::filesystem::exists(opt.traces)) {
    for (const auto& entry : std::filesystem::directory_iterator(opt.traces)) {
      if (entry.path().extension() != ".safetensors") continue;
      io::TraceReader reader(entry.path().string());
      for (int layer = 0; layer < reader.num_layers(); ++layer) {
        // Each layer as recorded (check), layer 0 also tiled to T tokens (check and time).
        Batch b = trace_batch(entry.path().string(), layer, 32, 0);
        const auto layout =
            random_layout(10 + layer, t4x8, b.num_experts, (3 * b.num_experts) / 64 + 1, 0.8);
        for (auto search : {CoverSearch::kMaskEnumeration, CoverSearch::kSubsetDp}) {
          check_assign(ctx, b, layout, search, false);
        }
        if (layer == 0) {
          Batch tiled = trace_batch(entry.path().string(), layer, 32, T);
          tiled.name += " tiled";
          trace_exec.push_back(check_assign(ctx, tiled, layout, CoverSearch::kAuto, true));
          traces.push_back(std::move(tiled));
        }
      }
    }
  } else {
    std::printf("  (no traces directory: real-trace cases skipped)\n");
  }

  // 2. Routing statistics: uniform, skewed, all-hot (every token picks experts 0..7: the worst
  // contention), a preset, real traces; each method that fits.
  const std::vector<StatsMethod> all = {StatsMethod::kSharedAggregated, StatsMethod::kSharedPlain,
                                        StatsMethod::kGlobalAggregated};
  Batch uniform = random_batch(11, T, 8, 256, 32, 0.0);
  uniform.name = "uniform";
  check_stats(ctx, uniform, all, true);
  Batch skewed = random_batch(12, T, 8, 256, 32, 4.0);
  skewed.name = "skewed (u^5)";
  check_stats(ctx, skewed, all, true);
  Batch hot = uniform;
  hot.name = "all tokens on experts 0-7";
  for (int64_t t = 0; t < hot.num_tokens(); ++t) {
    for (int k = 0; k < 8; ++k) hot.ids[t * 8 + k] = k;
  }
  check_stats(ctx, hot, all, true);
  check_stats(ctx, realistic, {StatsMethod::kAuto}, true);
  Batch wide = random_batch(13, T, 8, 640, 32, 1.0);
  wide.name = "random E640";
  check_stats(ctx, wide, all, true);
  for (const Batch& b : traces) check_stats(ctx, b, {StatsMethod::kAuto}, true);
  {
    Batch small = random_batch(14, 1001, 6, 60, 8, 1.0);
    small.name = "random small";
    check_stats(ctx, small, all, false);
    Batch many = random_batch(15, 3000, 24, 100, 8, 0.0);  // K > 16: the generic kernel
    many.name = "random K24";
    check_stats(ctx, many, all, false);
  }

  // 3. Dispatch layout from the assignments above.
  check_dispatch(ctx, rnd, exec4, t4x8, true);
  check_dispatch(ctx, rnd, exec4, t4x8, true, false);
  check_dispatch(ctx, realistic, exec_r, t4x8, true);
  check_dispatch(ctx, rnd16, exec16, t16x8, true);
  for (size_t i = 0; i < traces.size(); ++i) {
    check_dispatch(ctx, traces[i], trace_exec[i], t4x8, true);
  }
  {
    // Odd sizes, sources mixed within chunks, repeated ranks within a row.
    const Topology t3x5(3, 15);
    const auto layout = random_layout(16, t3x5, 45, 6, 0.7);
    Batch b = random_batch(17, 4099, 6, 45, 15, 1.0, false);
    b.name = "random mixed sources";
    std::vector<RankId> exec(b.ids.size());
    assign::assign_node_cover(b.view(), layout, {1, 2, 3, 0}, {}, exec);
    check_dispatch(ctx, b, exec, t3x5, false);
    for (size_t i = 0; i + 1 < exec.size(); i += 5) exec[i + 1] = exec[i];
    b.name = "repeated ranks";
    check_dispatch(ctx, b, exec, t3x5, false);
  }

  // 4. TopoEP: the shape (E = 640, G = 128) on the paper preset, E = 256 / G = 64 (the
  // UltraEP comparison point), and random shapes (check only).
  {
    const Batch b = preset_batch("paper-topoep-640x8", 128 * 4096, 128, 21);
    const auto demand = demand_of(b);
    check_topoep(ctx, "paper-topoep-640x8 4096/rank",
                 topoep_input(t16x8, 640, 2, 7168 * 2, 3.0 * 7168 * 2048 * 2, demand), true);
    check_topoep(ctx, "paper-topoep-640x8 small |W|",
                 topoep_input(t16x8, 640, 2, 7168 * 2, 1e6, demand), true);
    const Topology t8x8(8, 64);
    Batch b256 = random_batch(22, 64 * 4096, 8, 256, 64, 2.0);
    b256.name = "random";
    const auto demand256 = demand_of(b256);
    check_topoep(ctx, "random E256 4096/rank", topoep_input(t8x8, 256, 2, 7168 * 2, 1e6, demand256),
                 true);
    int random_cases = 0, random_bad = 0;
    for (uint64_t seed = 1; seed <= (opt.quick ? 20u : 200u); ++seed) {
      SplitMix64 rng(seed);
      const int nodes = 1 + static_cast<int>(rng.below(6));
      const int per_node = 1 + static_cast<int>(rng.below(8));
      const int experts = 8 + static_cast<int>(rng.below(300));
      const int extra = static_cast<int>(rng.below(5));
      const Topology topo(nodes, nodes * per_node);
      const Batch rb = random_batch(seed, 100 + rng.below(30000), 8, experts, topo.num_ranks(),
                                    4 * rng.unit(), rng.unit() < 0.5);
      const auto d = demand_of(rb);
      const size_t before = ctx.rows.size();
      const int failures = ctx.failures;
      check_topoep(
          ctx, "random shape " + std::to_string(seed),
          topoep_input(topo, experts, extra, 4096, rng.unit() < 0.5 ? 0 : 1e6 * rng.unit(), d),
          false, false);
      ++random_cases;
      random_bad += ctx.failures - failures;
      ctx.rows.resize(before);  // summarised below
    }
    Row summary;
    summary.kernel = "topoep";
    summary.input = std::to_string(random_cases) + " random shapes";
    summary.shape = "N<=6 M<=8 E<=307";
    summary.mismatches = opt.dry_run ? -1 : random_bad;
    ctx.rows.push_back(summary);
  }

  print_table(ctx);
  if (opt.dry_run) {
    std::printf("\ndry run: nothing was checked on a GPU (check column '-')\n");
    return 0;
  }
  std::printf("\n%s: %d failed check(s)\n", ctx.failures ? "FAILED" : "all checks passed",
              ctx.failures);
  return ctx.failures ? 1 : 0;
}

}  // namespace
}  // namespace cobalt::cuda::check

int main(int argc, char** argv) {
  cobalt::cuda::check::Options opt;
#ifdef COBALT_SHARED_DIR
  opt.traces = std::string(COBALT_SHARED_DIR) + "/data/traces";
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--traces") {
      opt.traces = value();
    } else if (a == "--tokens") {
      opt.tokens = std::stoll(value());
    } else if (a == "--reps") {
      opt.reps = std::max(1, std::stoi(value()));
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--dry-run") {
      opt.dry_run = true;
    } else if (a == "--csv") {
      opt.csv = value();
    } else {
      std::fprintf(stderr,
                   "usage: cobalt_gpu_check [--traces DIR] [--tokens N] [--reps N] [--quick] "
                   "[--dry-run] [--csv FILE]\n");
      return 64;
    }
  }
  try {
    return cobalt::cuda::check::run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cobalt_gpu_check: %s\n", e.what());
    return 3;
  }
}
