// Option groups shared by the commands that replay a workload (simulate, bench): one definition of
// each flag, its help text and its checks.
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
          ->check(non_negative());
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

}  // namespace cobalt::cli
