// Named workload presets: WorkloadSpecs calibrated to statistics reported by the Cobalt and TopoEP
// papers and measured on the shared real traces (DESIGN.md §3.3; eval/trace_stats.hpp computes
// them). Targets are whole-trace per-layer values averaged over layers; churn is that of the 8
// hottest experts between adjacent steps. docs/workloads.md has the default sizes (S x T_s x L,
// all overridable), measured values and the ranges the tests check.
//
// | preset              | E   | K | R  | load max/mean  | top-partner | count-wtd | churn |
// |---------------------|-----|---|----|----------------|-------------|-----------|-------|
// | uniform             | 64  | 8 | 8  | ~1             | chance .12  | chance .11| noise |
// | skewed              | 128 | 8 | 32 | ~7 (layers 5-10)| chance .2  | chance .09| ~0.17 |
// | coactivated-early   | 128 | 8 | 32 | ~3.5           | ~0.35       | ~0.15     | ~0.15 |
// | coactivated-late    | 128 | 8 | 32 | ~2.7           | ~0.88       | ~0.75     | ~0.15 |
// | realistic           | 64  | 8 | 8  | ~4             | ~0.45       | ~0.22     | ~0.17 |
// | paper-glm45air-ep32 | 128 | 8 | 32 | ~2.5           | ~0.88       | ~0.75     | ~0.15 |
// | paper-topoep-640x8  | 640 | 8 | 32 | ~26; static-EP rank imbalance ~8.4 (G=32) | ~0.18 |
//
// ("chance": the co-activation of independent picks; it depends on E, K, skew and token count.)
// paper-glm45air-ep32 steps hold one 8192-token sequence per source rank (T_s = 32 * 8192).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/workload/spec.hpp"

namespace cobalt::workload {

// Size overrides applied on top of a preset (each validated with the spec).
struct PresetOverrides {
  std::optional<int> num_steps;
  std::optional<int64_t> tokens_per_step;
  std::optional<int> num_layers;
  std::optional<int> num_sources;
  std::optional<uint64_t> seed;
};

struct PresetInfo {
  std::string name;
  std::string description;  // one line: what it models and its target statistics
};

// The presets, in a fixed order.
std::vector<PresetInfo> list_workload_presets();

// The spec of preset `name` with `overrides` applied, validated. Throws
// cobalt::Error(kInvalidArgument) "unknown workload preset 'x' (valid: uniform, skewed, ...)" for
// an unknown name, or naming the overridden field that is out of range.
WorkloadSpec workload_preset(std::string_view name, const PresetOverrides& overrides = {});

}  // namespace cobalt::workload
