#include "cobalt/workload/presets.hpp"

#include <fmt/format.h>

#include <functional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"

namespace cobalt::workload {

namespace {

struct Preset {
  const char* name;
  const char* description;
  WorkloadSpec (*make)();
};

WorkloadSpec uniform() {
  WorkloadSpec s;
  s.num_experts = 64;
  s.top_k = 8;
  s.num_layers = 2;
  s.num_steps = 20;
  s.tokens_per_step = 16384;
  s.num_sources = 8;
  return s;
}

WorkloadSpec skewed() {
  WorkloadSpec s;
  s.num_experts = 128;
  s.top_k = 8;
  s.num_layers = 4;
  s.num_steps = 20;
  s.tokens_per_step = 16384;
  s.num_sources = 32;
  s.zipf_exponent = 0.66;
  s.layer_skew_spread = 0.35;
  s.hot_churn = 0.17;
  s.group_size = 8;
  s.group_affinity = 0.0;
  return s;
}

WorkloadSpec coactivated(double affinity) {
  WorkloadSpec s;
  s.num_experts = 128;
  s.top_k = 8;
  s.num_layers = 2;
  s.num_steps = 20;
  s.tokens_per_step = 16384;
  s.num_sources = 32;
  s.zipf_exponent = 0.4;
  s.hot_churn = 0.15;
  s.group_size = 8;
  s.group_mixing = 0.0;  // hot experts co-activate with hot ones, so skew survives p -> 1
  s.group_affinity = affinity;
  s.num_domains = 4;
  s.domain_locality = 0.3;
  return s;
}

WorkloadSpec coactivated_early() { return coactivated(0.57); }
WorkloadSpec coactivated_late() { return coactivated(0.97); }

WorkloadSpec realistic() {
  WorkloadSpec s;
  s.num_experts = 64;
  s.top_k = 8;
  s.num_layers = 2;
  s.num_steps = 20;
  s.tokens_per_step = 16384;
  s.num_sources = 8;
  s.zipf_exponent = 0.78;
  s.layer_skew_spread = 0.3;
  s.hot_churn = 0.17;
  s.group_size = 8;
  s.group_mixing = 0.0;
  s.group_affinity = 0.63;
  s.group_churn = 0.02;
  s.num_domains = 4;
  s.domain_locality = 0.3;
  return s;
}

WorkloadSpec glm45air_ep32() {
  WorkloadSpec s = coactivated(0.95);  // fewer steps dilute less: 0.95 gives top-partner ~0.88
  s.num_layers = 2;
  s.num_steps = 6;
  s.num_sources = 32;
  s.tokens_per_step = 32 * 8192;  // one 8192-token sequence per source rank
  s.num_domains = 8;
  return s;
}

WorkloadSpec topoep_640x8() {
  // TopoEP Fig. 10: load concentrated on static EP's first rank (its 20 experts 13x as popular as
  // the rest), 4096 tokens per rank per step, hot-set churn as measured by TopoEP.
  WorkloadSpec s;
  s.num_experts = 640;
  s.top_k = 8;
  s.num_layers = 2;
  s.num_steps = 10;
  s.tokens_per_step = 32 * 4096;
  s.num_sources = 32;
  s.zipf_exponent = 0.0;
  s.hot_block_size = 20;
  s.hot_block_weight = 13.0;
  s.popularity_order = PopularityOrder::kById;
  s.hot_churn = 0.18;
  s.group_size = 8;
  return s;
}

// Cluster-scale stress test (performance issue): 1024 experts for 64 nodes x 8 ranks.
WorkloadSpec scale_1024() {
  WorkloadSpec s = coactivated(0.9);
  s.num_experts = 1024;
  s.num_layers = 1;
  s.num_steps = 3;
  s.num_sources = 512;
  s.tokens_per_step = 1 << 20;
  s.num_domains = 64;
  return s;
}

constexpr Preset kPresets[] = {
    {"uniform", "E=64 K=8 R=8: uniform routing, no co-activation structure or drift (control)",
     &uniform},
    {"skewed",
     "E=128 K=8 R=32: TopoEP-like load skew (per-layer max/mean 5-13, mean ~7), top-8 churn ~0.18, "
     "chance co-activation",
     &skewed},
    {"coactivated-early",
     "E=128 K=8 R=32: early-training co-activation (top-partner Ochiai ~0.35), mild skew, 4 "
     "domains",
     &coactivated_early},
    {"coactivated-late",
     "E=128 K=8 R=32: late-training co-activation (top-partner Ochiai ~0.88), mild skew, 4 domains",
     &coactivated_late},
    {"realistic",
     "E=64 K=8 R=8: matched to the shared real traces (top-partner ~0.45, count-weighted ~0.2, "
     "load max/mean ~4)",
     &realistic},
    {"paper-glm45air-ep32",
     "GLM-4.5-Air-like: E=128 K=8, 32 source ranks x 8192-token sequences per step, late "
     "co-activation (Cobalt paper setting)",
     &glm45air_ep32},
    {"paper-topoep-640x8",
     "TopoEP Fig. 10 setting: E=640 K=8 R=32, 4096 tokens per rank, static EP's first rank's "
     "experts 13x as popular (static-EP rank imbalance ~8.4 on 32 ranks)",
     &topoep_640x8},
    {"scale-1024",
     "Scale test: E=1024 K=8 R=512 (64 nodes x 8), co-activated, 1 layer, 2^20 tokens per step "
     "(raise with --tokens-per-step, e.g. 10^7)",
     &scale_1024},
};

}  // namespace

std::vector<PresetInfo> list_workload_presets() {
  std::vector<PresetInfo> out;
  for (const auto& p : kPresets) out.push_back({p.name, p.description});
  return out;
}

WorkloadSpec workload_preset(std::string_view name, const PresetOverrides& overrides) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    WorkloadSpec spec = p.make();
    spec.name = p.name;
    if (overrides.num_steps) spec.num_steps = *overrides.num_steps;
    if (overrides.tokens_per_step) spec.tokens_per_step = *overrides.tokens_per_step;
    if (overrides.num_layers) spec.num_layers = *overrides.num_layers;
    if (overrides.num_sources) {
      spec.num_sources = *overrides.num_sources;
      // Keep the preset's domains valid when the override leaves fewer sources than domains.
      if (spec.num_sources >= 1 && spec.num_domains > spec.num_sources) {
        spec.num_domains = spec.num_sources;
      }
    }
    if (overrides.seed) spec.seed = *overrides.seed;
    validate(spec);
    return spec;
  }
  std::string valid;
  for (const auto& p : kPresets) valid += fmt::format("{}{}", valid.empty() ? "" : ", ", p.name);
  fail(ErrorCode::kInvalidArgument, "unknown workload preset '{}' (valid: {})", printable(name),
       valid);
}

}  // namespace cobalt::workload
