// Option groups shared by the commands that replay a workload (simulate, bench): one definition of
// each flag, its help text and its checks.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>

#include "cobalt/core/text.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "commands.hpp"

namespace cobalt::cli {

void add_workload_options(CLI::App* cmd, std::string& trace_path, std::string& preset,
                          std::optional<int>& steps, std::optional<int64_t>& tokens_per_step) {
  auto* trace =
      cmd->add_option("--trace", trace_path, "cobalt-trace v1 file")->check(non_empty_path());
  auto* preset_option =
      cmd->add_option("--preset", preset,
                      "synthetic workload preset (see `cobalt trace gen --list-presets`)")
          ->check(non_empty_name());
  trace->excludes(preset_option);
  cmd->add_option("--steps", steps, "steps: generated (presets) or re-chunked / cycled (traces)")
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--tokens-per-step", tokens_per_step,
                  "tokens per step: generated (presets) or re-chunked / cycled (traces)")
      ->transform(integer_in(1, kMaxInt64));
}

void add_budget_options(CLI::App* cmd, double& rho, std::optional<int>& replica_slots) {
  auto* rho_option =
      cmd->add_option("--rho", rho, "replica budget: S = floor((1+rho) E / G) slots per rank")
          ->capture_default_str()
          ->transform(non_negative());
  auto* extra = cmd->add_option("--replica-slots", replica_slots,
                                "replica budget: S = ceil(E/G) + EXTRA slots per rank")
                    ->transform(integer_in(0, kMaxInt));
  rho_option->excludes(extra);
}

int slots_per_rank(int num_experts, int num_ranks, double rho,
                   const std::optional<int>& replica_slots) {
  return as_usage_error([&] {
    return replica_slots ? slots_for_extra(num_experts, num_ranks, *replica_slots)
                         : slots_for_rho(num_experts, num_ranks, rho);
  });
}

std::optional<std::string> cluster_preset_named(const std::string& cluster) {
  for (const eval::ClusterPreset& preset : eval::cluster_presets()) {
    if (preset.name == cluster) return preset.name;
  }
  return std::nullopt;
}

Topology parse_cluster(const std::string& cluster) {
  if (const auto preset = cluster_preset_named(cluster)) {
    return eval::cluster_preset(*preset).topology();
  }
  const auto x = cluster.find('x');
  auto digits = [](std::string_view text) {
    return !text.empty() &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (x == std::string::npos || !digits(std::string_view(cluster).substr(0, x)) ||
      !digits(std::string_view(cluster).substr(x + 1))) {
    std::vector<std::string> names;
    for (const eval::ClusterPreset& preset : eval::cluster_presets()) names.push_back(preset.name);
    throw UsageError(fmt::format(
        "cluster '{}' is neither NxM (N nodes, M ranks per node, e.g. 4x8) nor a cluster preset "
        "({})",
        printable(cluster), fmt::join(names, ", ")));
  }
  return as_usage_error([&] { return Topology::parse(cluster); });  // the range checks
}

}  // namespace cobalt::cli
