// Synthetic routing traces: a deterministic-per-seed generator of cobalt-trace data whose load
// skew, co-activation, hot-set drift and per-source domain locality follow a WorkloadSpec
// (spec.hpp, where the generative model and every knob are documented), and named presets matched
// to the statistics the papers and the shared real traces report (presets.hpp, docs/workloads.md).
#pragma once

#include <cstdint>
#include <functional>

#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/spec.hpp"

namespace cobalt::workload {

struct GenerateOptions {
  int num_threads = 1;  // 0 => hardware concurrency, < 0 refused; the result does not depend on it
  // Called after each (layer, step) with (units done, total units = L * S); may be empty.
  std::function<void(int64_t, int64_t)> progress;
};

// Generates the trace of `spec` (validated first; throws cobalt::Error naming the bad field):
//   topk_ids [L, T, K] (T = S * T_s), step_offsets [S + 1] = 0, T_s, 2 T_s, ..., source_rank [T]
//   (token i of a step from rank floor(i R / T_s)), num_sources = R, metadata: origin, workload,
//   seed and the knobs. Same spec => bitwise-identical data, for any num_threads.
io::TraceData generate_trace(const WorkloadSpec& spec, const GenerateOptions& options = {});

}  // namespace cobalt::workload
