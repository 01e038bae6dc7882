// cobalt_gpu_check: checks every CUDA kernel against its CPU reference and times it.
//
//   cobalt_gpu_check [--traces DIR] [--tokens N] [--reps N] [--quick] [--no-timing]
//                    [--no-injected-errors] [--dry-run] [--csv FILE]
//
// --no-timing checks each case once and times nothing, and --no-injected-errors skips the check
// that makes a failing CUDA call on purpose (what the runs under compute-sanitizer need: it would
// report that call). --dry-run builds the inputs and runs the CPU references only (no CUDA call),
// to test this program where there is no GPU. Correctness: each checked run writes into outputs
// pre-filled with a poison byte pattern, copies them back and compares every element with the CPU
// reference (bitwise; integers only), so an element the kernel fails to write is caught. Timing:
// CUDA events around each call on one stream, after 3 warm-up calls; the median and minimum of
// --reps calls. The floor is the bytes the call must move (inputs read once, outputs written once)
// over the device-to-device copy bandwidth measured at start-up (read + write bytes / time), the
// best a memory-bound kernel can do. Prints one table; exit status 1 if any check failed, 2 without
// a CUDA device.
#include "gpu_check_kernels.hpp"

namespace cobalt::cuda::check {
namespace {

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
    cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
    cuda_ok(cudaEventRecord(start, ctx.stream), "cudaEventRecord");
    cuda_ok(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, ctx.stream),
            "cudaMemcpyAsync D2D");
    cuda_ok(cudaEventRecord(stop, ctx.stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i > 0) times.push_back(ms);
    cuda_ok(cudaEventDestroy(start), "cudaEventDestroy");
    cuda_ok(cudaEventDestroy(stop), "cudaEventDestroy");
  }
  std::sort(times.begin(), times.end());
  ctx.copy_bandwidth = 2.0 * bytes / (times[times.size() / 2] * 1e-3);
}

int run_cases(Context& ctx);

void print_table(const Context& ctx) {
  std::printf("\n%-9s %-28s %-34s %-8s %9s %10s %10s %9s %9s %7s  %s\n", "kernel", "input", "shape",
              "check", "cpu_ms", "median_us", "min_us", "graph_us", "floor_us", "xfloor", "note");
  for (const Row& r : ctx.rows) {
    const double floor_us = r.bytes / ctx.copy_bandwidth * 1e6;
    char timing[112] = "", graph[16] = "-";
    if (r.graph_us >= 0) std::snprintf(graph, sizeof graph, "%.1f", r.graph_us);
    if (r.median_us >= 0) {
      std::snprintf(timing, sizeof timing, "%10.1f %10.1f %9s %9.2f %7.2f", r.median_us, r.min_us,
                    graph, floor_us, r.median_us / floor_us);
    } else {
      std::snprintf(timing, sizeof timing, "%10s %10s %9s %9.2f %7s", "-", "-", graph, floor_us,
                    "-");
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
      // -1 where a time was not measured; the note quoted (it holds commas).
      std::fprintf(f,
                   "kernel,input,shape,check,cpu_ms,median_us,min_us,graph_us,floor_us,bytes,"
                   "note\n");
      for (const Row& r : ctx.rows) {
        std::string note;
        for (char c : r.note) note += c == '"' ? std::string("\"\"") : std::string(1, c);
        std::fprintf(f, "%s,%s,%s,%s,%.3f,%.2f,%.2f,%.2f,%.3f,%.0f,\"%s\"\n", r.kernel.c_str(),
                     r.input.c_str(), r.shape.c_str(),
                     r.mismatches < 0    ? "-"
                     : r.mismatches == 0 ? "ok"
                                         : "FAIL",
                     r.cpu_ms, r.median_us, r.min_us, r.graph_us,
                     r.bytes / ctx.copy_bandwidth * 1e6, r.bytes, note.c_str());
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
    // Say why: an old driver (the bundle's static runtime needs one at least as new as its
    // toolkit) reads as "no device" otherwise.
    int count = 0, driver_version = 0, runtime_version = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    (void)cudaDriverGetVersion(&driver_version);
    (void)cudaRuntimeGetVersion(&runtime_version);
    (void)cudaGetLastError();
    std::printf(
        "cobalt_gpu_check: no CUDA device visible (cudaGetDeviceCount: %s, %s; %d devices; "
        "driver supports CUDA %d.%d, runtime %d.%d); nothing checked\n",
        cudaGetErrorName(status), cudaGetErrorString(status), count, driver_version / 1000,
        driver_version % 1000 / 10, runtime_version / 1000, runtime_version % 1000 / 10);
    return 2;
  }
  // A blocking stream: ordered with the legacy default stream that the set-up copies and memsets
  // use (they also wait for completion; DeviceBuffer).
  cuda_ok(cudaStreamCreate(&ctx.stream), "cudaStreamCreate");
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
  int status = 0;
  try {
    status = run_cases(ctx);
  } catch (const ContextLost& e) {
    std::printf("\nCUDA context lost (%s): the remaining checks cannot run; results so far:\n",
                e.what());
    print_table(ctx);
    return 1;
  }
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
    // 8 nodes: the four-word bitset cover (timed; Gosper's walk visited up to 247 masks here).
    const Topology t8x8(8, 64);
    const auto layout8 = random_layout(11, t8x8, 256, 6, 0.8);
    check_assign(ctx, random_batch(12, T, 8, 256, 64, 1.0), layout8, CoverSearch::kAuto, true);
  }
  {
    struct Small {
      int nodes, per_node, experts, top_k, slots;
    };
    uint64_t seed = 100;
    for (const Small c : {Small{1, 4, 16, 4, 6}, Small{2, 4, 32, 2, 6}, Small{3, 2, 24, 3, 6},
                          Small{5, 2, 40, 6, 6}, Small{6, 2, 48, 8, 6}, Small{7, 2, 56, 8, 6},
                          Small{8, 2, 64, 8, 6}, Small{8, 1, 40, 1, 8}, Small{12, 2, 96, 8, 6},
                          Small{20, 1, 80, 5, 6}}) {
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
    // An error left pending by an earlier CUDA call: refused and cleared, then the retry runs
    // (not under compute-sanitizer, which would count the failing call it makes on purpose).
    if (opt.injected_errors) check_pending_error(ctx, b, layout4);
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
    // Refinement with each node's state in global memory (over 48 KiB of it per node: 64 ranks
    // per node x 64 slots); every other shape here stages it in shared memory.
    const Topology t2x64(2, 128);
    Batch wide = random_batch(23, 128 * 256, 8, 256, 128, 2.0);
    wide.name = "random";
    check_topoep(ctx, "E256 S64 unstaged", topoep_input(t2x64, 256, 62, 4096, 1e6, demand_of(wide)),
                 false);
    // Stage 1 ranked by counting (E > 2048: the sort's keys would not fit); below, by the sort.
    Batch many = random_batch(24, 64 * 512, 8, 2304, 64, 1.0);
    many.name = "random";
    check_topoep(ctx, "E2304 counted ranking",
                 topoep_input(t8x8, 2304, 2, 7168 * 2, 1e6, demand_of(many)), false);
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
    } else if (a == "--no-timing") {
      opt.timing = false;
    } else if (a == "--dry-run") {
      opt.dry_run = true;
    } else if (a == "--no-injected-errors") {
      opt.injected_errors = false;
    } else if (a == "--csv") {
      opt.csv = value();
    } else {
      std::fprintf(stderr,
                   "usage: cobalt_gpu_check [--traces DIR] [--tokens N] [--reps N] [--quick] "
                   "[--no-timing] [--no-injected-errors] [--dry-run] [--csv FILE]\n");
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
