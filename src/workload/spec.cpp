#include "cobalt/workload/spec.hpp"

#include <algorithm>
#include <cmath>

#include "cobalt/core/error.hpp"

namespace cobalt::workload {

namespace {

// Largest trace the generator will build: 2^32 expert ids (16 GiB of int32).
constexpr int64_t kMaxExpertIds = int64_t{1} << 32;

void check_unit_interval(double value, const char* field) {
  COBALT_CHECK_ARG(std::isfinite(value) && value >= 0.0 && value <= 1.0,
                   "workload spec: {} = {} out of range [0, 1]", field, value);
}

}  // namespace

double WorkloadSpec::affinity_at(int step) const {
  if (final_group_affinity < 0.0 || num_steps <= 1) return group_affinity;
  const double frac = static_cast<double>(step) / static_cast<double>(num_steps - 1);
  return group_affinity + (final_group_affinity - group_affinity) * frac;
}

void validate(const WorkloadSpec& spec) {
  COBALT_CHECK_ARG(spec.num_experts >= 2 && spec.num_experts <= 65536,
                   "workload spec: num_experts = {} out of range [2, 65536]", spec.num_experts);
  const int max_top_k = std::min(spec.num_experts, 64);
  COBALT_CHECK_ARG(spec.top_k >= 1 && spec.top_k <= max_top_k,
                   "workload spec: top_k = {} out of range [1, {}] (at most min(num_experts, 64))",
                   spec.top_k, max_top_k);
  COBALT_CHECK_ARG(spec.num_layers >= 1 && spec.num_layers <= 4096,
                   "workload spec: num_layers = {} out of range [1, 4096]", spec.num_layers);
  COBALT_CHECK_ARG(spec.num_steps >= 1 && spec.num_steps <= 1000000,
                   "workload spec: num_steps = {} out of range [1, 1000000]", spec.num_steps);
  COBALT_CHECK_ARG(spec.tokens_per_step >= 1 && spec.tokens_per_step < (int64_t{1} << 31),
                   "workload spec: tokens_per_step = {} out of range [1, 2^31)",
                   spec.tokens_per_step);
  COBALT_CHECK_ARG(spec.num_sources >= 1 && spec.num_sources <= 65536,
                   "workload spec: num_sources = {} out of range [1, 65536]", spec.num_sources);
  // Guard the product against overflow before comparing it with the cap.
  const double num_ids = static_cast<double>(spec.num_layers) * spec.num_steps *
                         static_cast<double>(spec.tokens_per_step) * spec.top_k;
  COBALT_CHECK_ARG(
      num_ids <= static_cast<double>(kMaxExpertIds),
      "workload spec: num_layers * num_steps * tokens_per_step * top_k = {} x {} x {} x "
      "{} = {:.3g} expert ids exceeds the limit 2^32",
      spec.num_layers, spec.num_steps, spec.tokens_per_step, spec.top_k, num_ids);

  COBALT_CHECK_ARG(
      std::isfinite(spec.zipf_exponent) && spec.zipf_exponent >= 0.0 && spec.zipf_exponent <= 4.0,
      "workload spec: zipf_exponent = {} out of range [0, 4]", spec.zipf_exponent);
  COBALT_CHECK_ARG(spec.hot_block_size >= 0 && spec.hot_block_size <= spec.num_experts,
                   "workload spec: hot_block_size = {} out of range [0, {}]", spec.hot_block_size,
                   spec.num_experts);
  COBALT_CHECK_ARG(std::isfinite(spec.hot_block_weight) && spec.hot_block_weight >= 1.0 &&
                       spec.hot_block_weight <= 1000.0,
                   "workload spec: hot_block_weight = {} out of range [1, 1000]",
                   spec.hot_block_weight);
  COBALT_CHECK_ARG(std::isfinite(spec.layer_skew_spread) && spec.layer_skew_spread >= 0.0 &&
                       spec.layer_skew_spread < 1.0,
                   "workload spec: layer_skew_spread = {} out of range [0, 1)",
                   spec.layer_skew_spread);
  COBALT_CHECK_ARG(spec.popularity_order == PopularityOrder::kShuffled ||
                       spec.popularity_order == PopularityOrder::kById,
                   "workload spec: popularity_order = {} is not a PopularityOrder",
                   static_cast<int>(spec.popularity_order));

  check_unit_interval(spec.hot_churn, "hot_churn");
  COBALT_CHECK_ARG(spec.hot_count >= 1 && spec.hot_count <= spec.num_experts,
                   "workload spec: hot_count = {} out of range [1, {}] (num_experts)",
                   spec.hot_count, spec.num_experts);

  COBALT_CHECK_ARG(spec.group_size >= 1 && spec.group_size <= spec.num_experts,
                   "workload spec: group_size = {} out of range [1, {}] (num_experts)",
                   spec.group_size, spec.num_experts);
  check_unit_interval(spec.group_mixing, "group_mixing");
  check_unit_interval(spec.group_affinity, "group_affinity");
  COBALT_CHECK_ARG(std::isfinite(spec.final_group_affinity) && spec.final_group_affinity <= 1.0,
                   "workload spec: final_group_affinity = {} out of range [0, 1] (or < 0 for "
                   "constant affinity)",
                   spec.final_group_affinity);
  check_unit_interval(spec.group_churn, "group_churn");

  const int max_domains = std::min(spec.num_sources, spec.num_groups());
  COBALT_CHECK_ARG(spec.num_domains >= 1 && spec.num_domains <= max_domains,
                   "workload spec: num_domains = {} out of range [1, {}] (at most num_sources = {} "
                   "and the number of groups = {})",
                   spec.num_domains, max_domains, spec.num_sources, spec.num_groups());
  check_unit_interval(spec.domain_locality, "domain_locality");
}

const char* popularity_order_name(PopularityOrder order) {
  switch (order) {
    case PopularityOrder::kShuffled:
      return "shuffled";
    case PopularityOrder::kById:
      return "by-id";
  }
  return "unknown";
}

}  // namespace cobalt::workload
