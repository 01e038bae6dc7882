// `cobalt simulate`: replay a trace (file or synthetic preset) through policies on a modelled
// cluster and compare them (terminal tables, --json, --report HTML, --dump safetensors).
//
// Steps: presets take --steps / --tokens-per-step as generator sizes; trace files are re-chunked
// or cycled by them (eval/step_source.hpp), and a one-step trace without either option is
// re-chunked into kOneStepTraceSteps steps so that history-based policies can plan.
// Hold-out (--holdout F, 0 < F < 1): the first H = round(F S) steps (clamped to [1, S-1]) are the
// planning part, replayed through every policy but not measured; the remaining S - H steps are the
// evaluation part. Policies keep running online there, as in training: a layout used at step s was
// planned from steps before s (plus, for per-microbatch policies, step s's own routing), so no
// evaluated token was seen by a planner beforehand.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/dump.hpp"
#include "cobalt/eval/report.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/io/atomic_file.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "commands.hpp"
#include "output_batch.hpp"
#include "workload_input.hpp"

namespace cobalt::cli {
namespace {

constexpr int kOneStepTraceSteps = 8;
constexpr const char* kDefaultClusterPreset = "4x8-b200";

struct SimulateArgs {
  std::string trace_path, preset, cluster, cluster_preset, model, json_path, report_path, dump_dir;
  std::optional<std::string> policies;  // default: all
  double rho = 0.5, eps = 0.15, overlap = 0.0, planner_time_scale = 1.0;
  std::optional<int> replica_slots;
  std::optional<int> steps, layers;
  std::optional<int64_t> tokens_per_step;
  std::optional<double> holdout;
  std::optional<int> warmup_steps;  // default 1 (0 on a one-step trace)
  int steps_per_global_plan = 10, threads = 1;
  uint64_t seed = 0;
  bool async_planning = false;
  bool layout_pricing = false;
};

std::vector<std::string> parse_policies(const std::optional<std::string>& list) {
  const auto known = policy::policy_names();
  if (!list || *list == "all") return known;
  std::vector<std::string> names;
  std::string name;
  for (char c : *list + ",") {
    if (c != ',') {
      name += c;
      continue;
    }
    if (name.empty()) {
      throw UsageError(
          fmt::format("--policies '{}': empty policy name (valid: all, or a comma-"
                      "separated list of {})",
                      printable(*list), fmt::join(known, ", ")));
    }
    if (name == "all") {
      throw UsageError(fmt::format(
          "--policies '{}': 'all' stands alone (it names every policy; or list some of {})",
          printable(*list), fmt::join(known, ", ")));
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      throw UsageError(fmt::format("--policies '{}': policy '{}' listed twice", printable(*list),
                                   printable(name)));
    }
    names.push_back(name);
    name.clear();
  }
  for (const auto& n : names) {
    if (std::find(known.begin(), known.end(), n) == known.end()) {
      throw UsageError(
          fmt::format("unknown policy '{}' (valid: all, or a comma-separated list of "
                      "{})",
                      printable(n), fmt::join(known, ", ")));
    }
  }
  return names;
}

WorkloadInput load_input(const SimulateArgs& args, std::vector<std::string>& notes) {
  const bool is_trace = !args.trace_path.empty();
  if (is_trace && args.layers) {
    throw UsageError("simulate: --layers applies to --preset only (a trace has its own layers)");
  }
  workload::PresetOverrides overrides;
  eval::ChunkOptions chunks;
  if (is_trace) {
    chunks.num_steps = args.steps;
    chunks.tokens_per_step = args.tokens_per_step;
  } else {
    overrides.num_steps = args.steps;
    overrides.tokens_per_step = args.tokens_per_step;
    overrides.num_layers = args.layers;
    overrides.seed = args.seed;
  }
  WorkloadInput input =
      load_workload(args.trace_path, args.preset, overrides, "simulate", {}, chunks);
  const eval::ChunkInfo info = input.source->chunk_info();  // a copy: the source may be replaced
  if (is_trace && input.source->has_tokens() && input.source->num_steps() < 2 && !args.steps &&
      !args.tokens_per_step && info.trace_tokens >= 2) {
    // One step leaves nothing to plan from: re-chunk it.
    chunks.num_steps = static_cast<int>(std::min<int64_t>(kOneStepTraceSteps, info.trace_tokens));
    input.source = eval::make_step_source(*input.reader, chunks);
    notes.push_back(fmt::format(
        "the trace has one step; re-chunked into {} steps of ~{} tokens (choose with --steps N)",
        *chunks.num_steps, info.trace_tokens / *chunks.num_steps));
  } else if (info.mode != "trace" && is_trace) {
    notes.push_back(fmt::format(
        "trace of {} steps{} {} into {} steps ({:.2f} passes)", info.trace_steps,
        input.source->has_tokens() ? fmt::format(" / {} tokens", info.trace_tokens) : "", info.mode,
        input.source->num_steps(), info.passes));
    if (args.holdout && info.passes > 1.0) {
      notes.push_back(
          "--holdout on a cycled trace: measured steps replay tokens the planners saw in earlier "
          "steps (the split is not a held-out evaluation; use fewer steps or tokens per step)");
    }
  }
  return input;
}

// The run's dominant memory (eval::simulation_memory_bytes: the largest policy's state, per-layer
// statistics of cobalt and cobalt+ or the peers' [G, E] tables; the dump writer's buffers when
// `dump_topology` is given; a generated workload, which is held already) against the budget of
// core/memory.hpp: a failed precondition naming the estimate, the budget and what to lower, before
// the replay allocates it.
void require_run_memory(const WorkloadInput& input, const eval::SimulationOptions& options,
                        const Topology* dump_topology) {
  const eval::StepSource& source = *input.source;
  std::string breakdown;
  double total = eval::simulation_memory_bytes(source, options, &breakdown);
  if (dump_topology != nullptr) {
    const double dump = eval::DumpWriter::memory_bytes(source, *dump_topology,
                                                       options.policy_config.slots_per_rank);
    total += dump;
    breakdown += fmt::format("; --dump buffers {}", format_bytes(dump));
  }
  if (input.data) {
    const double workload =
        4.0 * static_cast<double>(input.data->topk_ids.size() + input.data->source_rank.size());
    total += workload;
    breakdown += fmt::format("; the generated workload {}", format_bytes(workload));
  }
  require_memory(total, fmt::format("simulate ({})", breakdown),
                 "lower the layers (--layers, or a trace with fewer), the experts or the ranks "
                 "(--cluster), leave the largest policy out (--policies), use fewer tokens per "
                 "step (--tokens-per-step), or fewer steps or tokens with --dump");
}

int measured_from(const SimulateArgs& args, int num_steps) {
  if (args.holdout) {
    const double f = *args.holdout;
    if (!(f > 0 && f < 1)) {
      throw UsageError(fmt::format("simulate: --holdout {} out of range (0, 1)", f));
    }
    if (num_steps < 2) throw UsageError("simulate: --holdout needs at least 2 steps");
    const int h = static_cast<int>(std::lround(f * num_steps));
    return std::clamp(h, 1, num_steps - 1);
  }
  if (!args.warmup_steps) return std::min(1, num_steps - 1);
  if (*args.warmup_steps >= num_steps) {
    throw UsageError(fmt::format(
        "simulate: --warmup-steps {} leaves no step to measure: it must be < the {} steps",
        *args.warmup_steps, num_steps));
  }
  return *args.warmup_steps;
}

// Usage error unless the measured steps hold some tokens (token traces) or some non-zero count
// (load-only traces): otherwise every policy ties at imbalance 1 and there is nothing to compare.
void require_measured_tokens(const eval::StepSource& source, int warmup_steps) {
  auto holds_tokens = [&](int step) {
    if (source.has_tokens()) return source.num_tokens(step) > 0;
    std::vector<int64_t> counts(source.num_experts());
    eval::StepScratch scratch;
    for (int layer = 0; layer < source.num_layers(); ++layer) {
      source.loads(step, layer, 1, counts, scratch);
      if (std::any_of(counts.begin(), counts.end(), [](int64_t c) { return c > 0; })) return true;
    }
    return false;
  };
  for (int step = warmup_steps; step < source.num_steps(); ++step) {
    if (holds_tokens(step)) return;
  }
  bool any = false;
  for (int step = 0; step < warmup_steps && !any; ++step) any = holds_tokens(step);
  const char* what = source.has_tokens() ? "empty steps in the trace" : "every count is zero";
  if (!any) {
    throw UsageError(fmt::format(
        "simulate: the trace holds no tokens ({}): nothing to compare (give a trace with routed "
        "tokens)",
        source.has_tokens() ? "every step is empty" : "a load-only trace whose counts are all 0"));
  }
  throw UsageError(fmt::format(
      "simulate: the measured steps [{}, {}) hold no tokens ({}): nothing to compare; choose "
      "--warmup-steps or --holdout so that they do",
      warmup_steps, source.num_steps(), what));
}

void run_simulate(const SimulateArgs& args) {
  eval::Scenario scenario;
  if (!args.model.empty()) {  // a bad name fails before the workload is generated
    as_usage_error([&] { return eval::model_preset(args.model); });
  }
  // Option errors and outputs that cannot be written fail before the workload is loaded or
  // generated, not after the run.
  std::vector<std::string> policies = parse_policies(args.policies);
  if (!args.json_path.empty()) require_output_file(args.json_path, "--json", args.trace_path);
  if (!args.report_path.empty()) {
    require_output_file(args.report_path, "--report", args.trace_path);
  }
  if (!args.dump_dir.empty()) require_dump_directory(args.dump_dir, policies, args.trace_path);
  require_distinct_outputs({{"--json", args.json_path}, {"--report", args.report_path}},
                           args.dump_dir, eval::dump_file_names(policies));
  WorkloadInput input = load_input(args, scenario.notes);
  const auto& source = *input.source;

  // --cluster 4x8-h800 (a preset's name, as DESIGN.md §5 names clusters) is --cluster-preset.
  std::string shape = args.cluster, preset_name = args.cluster_preset;
  if (const auto named = cluster_preset_named(args.cluster)) {
    if (!preset_name.empty() && preset_name != *named) {
      throw UsageError(
          fmt::format("--cluster {} is a cluster preset, and --cluster-preset {} another: give one",
                      *named, preset_name));
    }
    preset_name = *named;
    shape.clear();
  }
  const eval::ClusterPreset cluster = as_usage_error([&] {
    return eval::cluster_preset(preset_name.empty() ? kDefaultClusterPreset : preset_name);
  });
  const LinkParams links{cluster.nvlink_bytes_per_s, cluster.ib_bytes_per_s_per_node};
  Topology topology = cluster.topology();
  if (!shape.empty()) {
    const Topology parsed = parse_cluster(shape);
    topology = Topology(parsed.num_nodes(), parsed.num_ranks(), links);
  }
  if (!shape.empty() && topology.to_string() != cluster.topology().to_string()) {
    scenario.notes.push_back(
        fmt::format("cluster {} uses the per-GPU and per-node hardware numbers "
                    "of {}",
                    topology.to_string(), cluster.name));
  }
  const auto [model, model_reason] = choose_model(args.model, input);
  if (model.num_experts != source.num_experts() || model.top_k != source.top_k()) {
    scenario.notes.push_back(fmt::format(
        "the workload has E={} K={}, model {} has E={} K={}: the workload keeps its own E and K "
        "and takes only sizes (hidden, expert FFN, bytes) from the model",
        source.num_experts(), source.top_k(), model.name, model.num_experts, model.top_k));
  }

  eval::CostParams cost = eval::make_cost_params(cluster, model);
  cost.overlap_fraction = args.overlap;
  cost.planner_time_scale = args.planner_time_scale;
  as_usage_error([&] {
    cost.validate();
    return 0;
  });

  // Option errors first (before the replica budget, which depends on several of them).
  const int warmup_steps = measured_from(args, source.num_steps());
  require_measured_tokens(source, warmup_steps);
  if (source.has_tokens()) {
    // Every policy's limit before any of them runs (load-only replays skip these policies).
    const auto over = eval::policies_over_top_k(policies, source.top_k());
    if (!over.empty()) {
      throw UsageError(fmt::format(
          "simulate: the workload has top-k {}; policy {} replays top-k <= {} (Algorithm 1's "
          "node cover): leave {} out with --policies",
          source.top_k(), fmt::join(over, ", "), eval::policy_max_top_k(over.front()),
          over.size() == 1 ? "it" : "them"));
    }
  }
  if (!args.dump_dir.empty() && !source.has_tokens()) {
    throw UsageError("simulate: --dump needs a token-level trace (this one is load-only)");
  }

  policy::PolicyConfig config;
  config.topology = topology;
  config.num_experts = source.num_experts();
  config.top_k = source.top_k();
  config.num_layers = source.num_layers();
  config.slots_per_rank =
      slots_per_rank(config.num_experts, topology.num_ranks(), args.rho, args.replica_slots);
  config.eps = args.eps;
  config.steps_per_global_plan = args.steps_per_global_plan;
  config.seed = args.seed;
  config.num_threads = args.threads;
  config.async_planning = args.async_planning;
  config.token_bytes = cost.token_bytes();
  config.expert_param_bytes = cost.expert_param_bytes();
  config.gemm_flops_per_s = cost.achievable_flops;  // the peers' cost models see the modelled GPU
  if (args.layout_pricing) config.cost_model = cost;

  eval::SimulationOptions options;
  options.policy_config = config;
  options.policies = std::move(policies);
  options.warmup_steps = warmup_steps;
  options.cost = cost;
  require_run_memory(input, options, args.dump_dir.empty() ? nullptr : &topology);
  std::unique_ptr<eval::DumpWriter> dump;
  if (!args.dump_dir.empty()) {
    dump = std::make_unique<eval::DumpWriter>(args.dump_dir, source, topology,
                                              config.slots_per_rank, options.warmup_steps);
    options.observer = dump.get();
  }
  Progress progress("simulate", static_cast<int64_t>(options.policies.size()) * source.num_steps());
  options.progress = [&](int64_t, int64_t) { progress.advance(); };
  const auto result = eval::simulate(source, options);
  progress.finish();

  scenario.workload = args.trace_path.empty() ? args.preset : args.trace_path;
  scenario.cluster = topology.to_string();
  scenario.cluster_preset = cluster.name;
  scenario.model = model;
  scenario.model_reason = model_reason;
  scenario.cost = cost;
  scenario.chunks = source.chunk_info();
  scenario.holdout = args.holdout;
  scenario.slots_per_rank = config.slots_per_rank;
  if (args.replica_slots)
    scenario.replica_slots = *args.replica_slots;
  else
    scenario.rho = args.rho;
  scenario.eps = args.eps;
  scenario.steps_per_global_plan = args.steps_per_global_plan;
  scenario.seed = args.seed;
  scenario.async_planning = args.async_planning;
  scenario.layout_pricing = args.layout_pricing;
  fmt::print("{}", eval::simulation_table(scenario, result));
  // Each output is written completely or not at all (an existing file is kept on failure), and
  // one that fails does not cost the others: every output is tried, then the first failure is
  // reported, naming the outputs that were written. The dump appears only now, complete (until
  // here it is in a temporary directory; an earlier dump in the directory stays until this point).
  OutputBatch outputs;
  if (!args.json_path.empty()) {
    outputs.write("--json", [&] {
      io::write_file_atomically(args.json_path, eval::simulation_json(scenario, result), "--json");
    });
  }
  if (!args.report_path.empty()) {
    outputs.write("--report", [&] {
      const auto extras =
          eval::collect_report_extras(source, 0, options.warmup_steps, topology.num_ranks());
      io::write_file_atomically(args.report_path, eval::simulation_html(scenario, result, extras),
                                "--report");
    });
  }
  if (dump) outputs.write("--dump", [&] { dump->commit(); });
  outputs.finish();
}

}  // namespace

void register_simulate_command(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  auto* cmd = app.add_subcommand(
      "simulate", "Replay a routing trace through policies on a modelled cluster (times modelled)");
  add_workload_options(cmd, args->trace_path, args->preset, args->steps, args->tokens_per_step);
  cmd->add_option("--cluster", args->cluster,
                  "NxM: N nodes of M ranks (hardware numbers from --cluster-preset; default: "
                  "the --cluster-preset's own shape), or a cluster preset's name (= "
                  "--cluster-preset NAME)")
      ->check(non_empty_value());
  cmd->add_option("--cluster-preset", args->cluster_preset,
                  "modelled hardware: 4x8-b200 (default) or 4x8-h800")
      ->check(non_empty_value());
  cmd->add_option(
         "--model", args->model,
         "model sizes for the cost model: glm-4.5-air, deepseek-v3, qwen3-30b-a3b, "
         "deepseek-v2, deepseek-v2-lite, olmoe-1b-7b, qwen1.5-moe-a2.7b (default: from the trace's "
         "metadata or E/K, else glm-4.5-air)")
      ->check(non_empty_value());
  cmd->add_option("--policies", args->policies, "comma-separated policy names, or 'all' (default)");
  add_budget_options(cmd, args->rho, args->replica_slots);
  cmd->add_option("--eps", args->eps, "load tolerance (1+eps) x mean for planners")
      ->capture_default_str()
      ->transform(number_in(0, kMaxEps));
  auto* warmup =
      cmd->add_option("--warmup-steps", args->warmup_steps,
                      "steps replayed but not measured (default 1, or 0 on a one-step trace; "
                      "must be < the number of steps)")
          ->transform(integer_in(0, kMaxInt));
  auto* holdout = cmd->add_option("--holdout", args->holdout,
                                  "plan on the first fraction F of the steps, measure the rest "
                                  "(0 < F < 1; replaces --warmup-steps)")
                      ->transform(number_in(0, 1, /*lo_open=*/true, /*hi_open=*/true));
  holdout->excludes(warmup);
  cmd->add_option("--steps-per-global-plan", args->steps_per_global_plan,
                  "Cobalt's global re-layout period P")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--layers", args->layers, "MoE layers (presets)")->transform(integer_in(1, 4096));
  cmd->add_option("--overlap", args->overlap,
                  "cost model: fraction of min(compute, exchange) hidden by overlap, in [0, 1]")
      ->capture_default_str()
      ->transform(number_in(0.0, 1.0));
  cmd->add_option("--planner-time-scale", args->planner_time_scale,
                  "cost model: factor on measured planner time, in [0, 1000] (0 leaves planning "
                  "out, so modelled times repeat exactly from run to run and machine to machine)")
      ->capture_default_str()
      ->transform(number_in(0, eval::kMaxPlannerTimeScale));
  cmd->add_option("--seed", args->seed, "seed for generation and randomised choices")
      ->capture_default_str()
      ->transform(seed_value());
  cmd->add_option("--threads", args->threads,
                  "worker threads of the policies (results do not depend on it; a preset is "
                  "generated on every core)")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxThreads));
  cmd->add_flag("--async-planning", args->async_planning,
                "plan on a background thread; layouts apply one step later (planning overlapped)");
  cmd->add_flag(
      "--layout-pricing", args->layout_pricing,
      "cobalt+ prices layouts with the cost model: also plans smaller replica budgets, "
      "keeps the lowest modelled step time, applies stage-2 moves and stage-2b swaps only "
      "when they pay");
  cmd->add_option("--json", args->json_path, "write the comparison as JSON (DESIGN.md §3.2)")
      ->check(non_empty_path());
  cmd->add_option("--report", args->report_path, "write a self-contained HTML report")
      ->check(non_empty_path());
  cmd->add_option("--dump", args->dump_dir,
                  "write DIR/routing.safetensors and DIR/<policy>.safetensors (exec_rank, layout)")
      ->check(non_empty_directory());
  cmd->callback([args] { run_simulate(*args); });
}

}  // namespace cobalt::cli
