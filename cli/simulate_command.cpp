// `cobalt simulate`: replay a trace (file or synthetic preset) through policies and compare them.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <fstream>
#include <memory>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/report.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/synthetic.hpp"
#include "commands.hpp"
#include "workload_input.hpp"

namespace cobalt::cli {
namespace {

struct SimulateArgs {
  std::string trace_path, preset, cluster = "4x8", policies, json_path;
  double rho = 0.5, eps = 0.15;
  std::optional<int> replica_slots;
  std::optional<int> steps, layers;
  std::optional<int64_t> tokens_per_step;
  int warmup_steps = 1, steps_per_global_plan = 10, threads = 1;
  uint64_t seed = 0;
  bool async_planning = false;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) fail(ErrorCode::kInvalidArgument, "cannot open '{}' for writing", path);
  out << text;
  if (!out) fail(ErrorCode::kInvalidArgument, "failed writing '{}'", path);
}

void run_simulate(const SimulateArgs& args) {
  workload::PresetOverrides overrides;
  overrides.num_steps = args.steps;
  overrides.tokens_per_step = args.tokens_per_step;
  overrides.num_layers = args.layers;
  overrides.seed = args.seed;
  WorkloadInput input = load_workload(args.trace_path, args.preset, overrides, "simulate");
  const auto& source = input.source;
  Topology topology = Topology::parse(args.cluster);
  policy::PolicyConfig config;
  config.topology = topology;
  config.num_experts = source->num_experts();
  config.top_k = source->top_k();
  config.num_layers = source->num_layers();
  config.slots_per_rank =
      args.replica_slots
          ? slots_for_extra(config.num_experts, topology.num_ranks(), *args.replica_slots)
          : slots_for_rho(config.num_experts, topology.num_ranks(), args.rho);
  config.eps = args.eps;
  config.steps_per_global_plan = args.steps_per_global_plan;
  config.seed = args.seed;
  config.num_threads = args.threads;
  config.async_planning = args.async_planning;

  eval::SimulationOptions options;
  options.policy_config = config;
  if (args.policies.empty() || args.policies == "all") {
    options.policies = policy::policy_names();
  } else {
    std::string name;
    for (char c : args.policies + ",") {
      if (c == ',') {
        if (!name.empty()) options.policies.push_back(name);
        name.clear();
      } else {
        name += c;
      }
    }
  }
  const auto known = policy::policy_names();
  for (const auto& name : options.policies) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw UsageError(
          fmt::format("unknown policy '{}' (valid: {})", name, fmt::join(known, ", ")));
    }
  }
  options.warmup_steps = std::min(args.warmup_steps, std::max(0, source->num_steps() - 1));
  Progress progress("simulate",
                    static_cast<int64_t>(options.policies.size()) * source->num_steps());
  options.progress = [&](int64_t, int64_t) { progress.advance(); };
  const auto result = eval::simulate(*source, options);
  progress.finish();

  eval::Scenario scenario;
  scenario.workload = args.trace_path.empty() ? args.preset : args.trace_path;
  scenario.cluster = topology.to_string();
  scenario.slots_per_rank = config.slots_per_rank;
  if (args.replica_slots)
    scenario.replica_slots = *args.replica_slots;
  else
    scenario.rho = args.rho;
  scenario.eps = args.eps;
  scenario.steps_per_global_plan = args.steps_per_global_plan;
  scenario.seed = args.seed;
  fmt::print("{}", eval::simulation_table(scenario, result));
  if (!args.json_path.empty()) write_file(args.json_path, eval::simulation_json(scenario, result));
}

}  // namespace

void register_simulate_command(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  auto* cmd = app.add_subcommand("simulate",
                                 "Replay a routing trace through policies on a modelled cluster");
  auto* trace = cmd->add_option("--trace", args->trace_path, "cobalt-trace v1 file");
  auto* preset =
      cmd->add_option("--preset", args->preset,
                      "synthetic workload preset (see `cobalt trace gen --list-presets`)");
  trace->excludes(preset);
  cmd->add_option("--cluster", args->cluster, "NxM: N nodes of M ranks")->capture_default_str();
  cmd->add_option("--policies", args->policies, "comma-separated policy names, or 'all' (default)");
  auto* rho =
      cmd->add_option("--rho", args->rho, "replica budget: S = floor((1+rho) E / G) slots per rank")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  auto* extra = cmd->add_option("--replica-slots", args->replica_slots,
                                "replica budget: S = ceil(E/G) + N slots per rank")
                    ->check(CLI::NonNegativeNumber);
  rho->excludes(extra);
  cmd->add_option("--eps", args->eps, "load tolerance (1+eps) x mean for planners")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--warmup-steps", args->warmup_steps, "steps replayed but not measured")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps-per-global-plan", args->steps_per_global_plan,
                  "Cobalt's global re-layout period P")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", args->steps, "steps to generate (presets)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tokens-per-step", args->tokens_per_step, "tokens per step (presets)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--layers", args->layers, "MoE layers (presets)")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", args->seed, "seed for generation and randomised choices")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--async-planning", args->async_planning,
                "plan on a background thread; layouts apply one step later");
  cmd->add_option("--json", args->json_path, "write the comparison as JSON (DESIGN.md §3.2)");
  cmd->callback([args] { run_simulate(*args); });
}

}  // namespace cobalt::cli
