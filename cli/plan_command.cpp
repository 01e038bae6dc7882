// `cobalt plan`: one stage-1 planning call on a trace's statistics; prints the layout as JSON and,
// with --backend milp|both, the CBC objective, bound and the heuristic's gap to it.
#include <fmt/core.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/io/atomic_file.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/milp_planner.hpp"
#include "cobalt/plan/node_plan.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/synthetic.hpp"
#include "commands.hpp"
#include "workload_input.hpp"

namespace cobalt::cli {
namespace {

struct PlanArgs {
  std::string trace_path, preset, cluster = "2x4", backend = "heuristic", out_path;
  double rho = 0.5, eps = 0.15, time_limit_s = 60;
  int layer = 0, restarts = 16;
  std::optional<int> steps, experts;
  std::optional<int64_t> tokens_per_step;
  uint64_t seed = 0;
};

double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void run_plan(const PlanArgs& args) {
  if (args.backend != "heuristic" && args.backend != "milp" && args.backend != "both") {
    throw UsageError(fmt::format("unknown backend '{}' (valid: heuristic, milp, both)",
                                 printable(args.backend)));
  }
  const Topology topology = parse_cluster(args.cluster);
  if (!args.trace_path.empty() && (args.steps || args.tokens_per_step || args.experts)) {
    throw UsageError(
        "plan: --steps, --tokens-per-step and --experts apply to --preset only (a trace has its "
        "own)");
  }
  if (!args.out_path.empty()) require_output_file(args.out_path, "--out", args.trace_path);
  workload::PresetOverrides overrides;
  overrides.num_steps = args.steps;
  overrides.tokens_per_step = args.tokens_per_step;
  overrides.seed = args.seed;
  WorkloadInput workload_input = load_workload(
      args.trace_path, args.preset, overrides, "plan", [&](workload::WorkloadSpec& spec) {
        if (!args.experts) return;
        // A smaller instance of the same workload family (e.g. one CBC can prove optimal).
        spec.num_experts = *args.experts;
        spec.top_k = std::min(spec.top_k, std::max(1, *args.experts / 2));
        spec.group_size = std::min(spec.group_size, *args.experts);
        spec.hot_count = std::min(spec.hot_count, *args.experts - 1);
        const int num_groups = (spec.num_experts + spec.group_size - 1) / spec.group_size;
        spec.num_domains = std::min(spec.num_domains, num_groups);
      });
  const auto& source = workload_input.source;
  if (!source->has_tokens()) {
    throw UsageError(
        "plan: the trace is load-only (counts): planning needs per-token routing (topk_ids) for "
        "the co-activation statistics");
  }
  if (args.layer < 0 || args.layer >= source->num_layers()) {
    throw UsageError(
        fmt::format("--layer {} out of range [0, {})", args.layer, source->num_layers()));
  }
  // Exact statistics over the whole trace for the chosen layer.
  RoutingStats stats = RoutingStats::exact_counts(source->num_experts());
  eval::StepScratch scratch;
  for (int s = 0; s < source->num_steps(); ++s) {
    stats.update(source->batch(s, args.layer, topology.num_ranks(), scratch));
  }
  const int slots = slots_for_rho(source->num_experts(), topology.num_ranks(), args.rho);
  plan::GlobalPlanInput input{topology, source->num_experts(), slots,
                              args.eps, stats.expert_load(),   stats.coactivation()};
  nlohmann::json report;
  report["cluster"] = topology.to_string();
  report["num_experts"] = source->num_experts();
  report["slots_per_rank"] = slots;
  report["eps"] = args.eps;

  plan::HeuristicOptions hopts;
  hopts.num_restarts = args.restarts;
  hopts.seed = args.seed;
  auto start = std::chrono::steady_clock::now();
  const auto heuristic = plan::plan_global_heuristic(input, hopts);
  report["heuristic"] = {{"objective", heuristic.objective},
                         {"wall_ms", elapsed_ms(start)},
                         {"within_cap", heuristic.within_cap},
                         {"restart_objectives", heuristic.restart_objectives}};
  plan::NodePlan chosen = heuristic.plan;
  std::optional<plan::MilpResult> solved;  // CBC's answer, when it ran
  if (args.backend != "heuristic") {
    plan::MilpOptions mopts;
    mopts.time_limit_s = args.time_limit_s;
    // The heuristic may return a plan above the load cap (it has no repair step); CBC takes
    // only valid starts, so such a plan is reported and not used.
    const std::string warm_start_problem =
        args.backend == "both" ? plan::check_node_plan(input, heuristic.plan) : std::string();
    mopts.warm_start =
        args.backend == "both" && warm_start_problem.empty() ? &heuristic.plan : nullptr;
    if (!warm_start_problem.empty()) {
      write_stderr(fmt::format("cobalt plan: heuristic plan not used as CBC's start ({})\n",
                               warm_start_problem));
      report["heuristic"]["valid"] = false;
      report["heuristic"]["invalid_because"] = warm_start_problem;
    }
    write_stderr(fmt::format("cobalt plan: running CBC (time limit {} s)...\n", args.time_limit_s));
    try {
      solved.emplace(plan::solve_global_milp(input, mopts));
    } catch (const Error& e) {
      // With both backends a model too large to build leaves the heuristic's answer standing.
      if (args.backend != "both" || e.code() != ErrorCode::kFailedPrecondition) throw;
      write_stderr(
          fmt::format("cobalt plan: CBC not run, keeping the heuristic's plan ({})\n", e.what()));
      report["milp"] = {{"status", "too_large"}, {"error", e.what()}};
    }
  }
  if (solved) {
    const plan::MilpResult& milp = *solved;
    // No solution (e.g. the watchdog stopped CBC first): no objective either, not 0.
    const nlohmann::json objective =
        milp.has_solution ? nlohmann::json(milp.objective) : nlohmann::json(nullptr);
    report["milp"] = {{"status", milp.status},   {"objective", objective},
                      {"bound", milp.bound},     {"gap", milp.gap},
                      {"optimal", milp.optimal}, {"seconds", milp.seconds}};
    if (!milp.error.empty()) {
      report["milp"]["error"] = milp.error;
      write_stderr(fmt::format("cobalt plan: CBC gave no answer ({}); {}\n", milp.error,
                               milp.has_solution ? "keeping the warm start (the heuristic's plan)"
                                                 : "the layout is the heuristic's plan"));
    }
    report["heuristic"]["gap_to_milp_bound"] = plan::relative_gap(heuristic.objective, milp.bound);
    if (milp.optimal) {
      report["heuristic"]["fraction_of_optimum"] =
          milp.objective > 0 ? heuristic.objective / milp.objective : 1.0;
    }
    if (milp.has_solution && milp.objective > heuristic.objective) chosen = milp.plan;
  }
  const ExpertLayout layout = plan::pack_ranks(input, chosen, nullptr, nullptr);
  report["layout"] = nlohmann::json::parse(layout.to_json());
  const std::string text = report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  if (args.out_path.empty()) {
    fmt::print("{}\n", text);
  } else {
    io::write_file_atomically(args.out_path, text + "\n", "--out");
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd =
      app.add_subcommand("plan", "One stage-1 global planning call; prints the layout as JSON");
  cmd->add_option("--trace", args->trace_path, "cobalt-trace v1 file")->check(non_empty_path());
  cmd->add_option("--preset", args->preset, "synthetic workload preset")->check(non_empty_name());
  cmd->add_option("--cluster", args->cluster, "NxM: N nodes of M ranks, or a cluster preset's name")
      ->capture_default_str();
  cmd->add_option("--layer", args->layer, "MoE layer whose statistics to plan for")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxInt));
  cmd->add_option("--rho", args->rho, "replica budget rho")
      ->capture_default_str()
      ->transform(non_negative());
  cmd->add_option("--eps", args->eps, "load tolerance eps")
      ->capture_default_str()
      ->transform(number_in(0, kMaxEps));
  cmd->add_option("--backend", args->backend,
                  "heuristic | milp | both (MILP warm-started by the heuristic)")
      ->capture_default_str();
  cmd->add_option("--time-limit", args->time_limit_s,
                  "CBC time limit in seconds, in (0, 1e6] (a hard watchdog adds 50%+5 s)")
      ->capture_default_str()
      ->transform(number_in(0, kMaxTimeLimitSeconds, /*lo_open=*/true));
  cmd->add_option("--restarts", args->restarts, "heuristic restarts")
      ->capture_default_str()
      ->transform(integer_in(1, plan::kMaxPlannerRestarts));
  cmd->add_option("--steps", args->steps, "steps to generate (presets)")
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--tokens-per-step", args->tokens_per_step, "tokens per step (presets)")
      ->transform(integer_in(1, kMaxInt64));
  cmd->add_option("--experts", args->experts,
                  "presets: override the number of experts (top-k capped at E/2)")
      ->transform(integer_in(2, 65536));
  cmd->add_option("--seed", args->seed, "seed")->capture_default_str()->transform(seed_value());
  cmd->add_option("--out", args->out_path, "write the JSON here instead of stdout")
      ->check(non_empty_path());
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace cobalt::cli
