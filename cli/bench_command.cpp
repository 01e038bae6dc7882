// `cobalt bench`: wall-clock time of the per-step work on one (step, layer) batch of a trace or
// preset, at a chosen cluster shape and replica budget: each library call alone (statistics,
// stage-1 heuristic, packing, Algorithm 1, stage 2, cobalt+'s assignment, dispatch layout,
// TopoEP), next to the memory-copy floor of the same bytes, then whole steps of the cobalt,
// cobalt+ and topoep policies (eval/step_timing.hpp). Prints a table; --json writes it.
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/step_timing.hpp"
#include "cobalt/io/atomic_file.hpp"
#include "cobalt/policy/policy.hpp"
#include "commands.hpp"
#include "workload_input.hpp"

namespace cobalt::cli {
namespace {

struct BenchArgs {
  std::string trace_path, preset, cluster = "4x8", model, json_path;
  double rho = 0.5, eps = 0.15, max_seconds = 10;
  std::optional<int> replica_slots, steps;
  std::optional<int64_t> tokens_per_step;
  int step = 0, layer = 0, threads = 1, reps = 5;
  uint64_t seed = 0;
};

// "312 M tokens/s" style rate; empty when the operation has no per-item rate.
std::string rate(const eval::TimedOperation& op) {
  if (op.items <= 0 || op.median_ms <= 0) return "";
  const double per_s = op.items / (op.median_ms * 1e-3);
  if (per_s >= 1e9) return fmt::format("{:.2f} G {}/s", per_s * 1e-9, op.unit);
  if (per_s >= 1e6) return fmt::format("{:.1f} M {}/s", per_s * 1e-6, op.unit);
  return fmt::format("{:.0f} k {}/s", per_s * 1e-3, op.unit);
}

void run_bench(const BenchArgs& args) {
  const Topology topology = parse_cluster(args.cluster);
  workload::PresetOverrides overrides;
  eval::ChunkOptions chunks;
  if (args.trace_path.empty()) {
    overrides.num_steps = args.steps;
    overrides.tokens_per_step = args.tokens_per_step;
    overrides.seed = args.seed;
  } else {
    chunks.num_steps = args.steps;
    chunks.tokens_per_step = args.tokens_per_step;
  }
  if (!args.json_path.empty()) require_output_file(args.json_path, "--json", args.trace_path);
  if (!args.model.empty()) {  // a bad name fails before the workload is generated
    as_usage_error([&] { return eval::model_preset(args.model); });
  }
  WorkloadInput input = load_workload(args.trace_path, args.preset, overrides, "bench", {}, chunks);
  const eval::StepSource& source = *input.source;
  if (!source.has_tokens()) {
    throw UsageError("bench: the trace is load-only (counts): the timed operations need tokens");
  }
  if (args.step < 0 || args.step >= source.num_steps()) {
    throw UsageError(
        fmt::format("bench: --step {} out of range [0, {})", args.step, source.num_steps()));
  }
  if (args.layer < 0 || args.layer >= source.num_layers()) {
    throw UsageError(
        fmt::format("bench: --layer {} out of range [0, {})", args.layer, source.num_layers()));
  }
  const int num_experts = source.num_experts(), num_ranks = topology.num_ranks();
  const int slots = slots_per_rank(num_experts, num_ranks, args.rho, args.replica_slots);
  const auto [model, model_reason] = choose_model(args.model, input);
  const eval::CostParams cost =
      eval::make_cost_params(eval::cluster_preset("4x8-b200"), model);  // sizes only
  // The cobalt / cobalt+ rows build one policy at a time for layers 0..--layer
  // (policy::policy_memory: routing statistics, ~19 E^2 bytes a layer): refused up front when the
  // larger of the two exceeds the memory budget.
  policy::PolicyConfig policy_config;
  policy_config.topology = topology;
  policy_config.num_experts = num_experts;
  policy_config.num_layers = args.layer + 1;
  require_memory(std::max(policy::policy_memory("cobalt", policy_config).total_bytes(),
                          policy::policy_memory("cobalt+", policy_config).total_bytes()),
                 fmt::format("bench: the policy steps' statistics for {} layers x {} x {} experts",
                             args.layer + 1, num_experts, num_experts),
                 "choose a lower --layer");
  // The topoep rows (its solver alone and its policy step) route through [G, E] tables (~17 E G
  // bytes, policy::policy_memory), after the cobalt rows have freed theirs.
  require_memory(policy::policy_memory("topoep", policy_config).total_bytes(),
                 fmt::format("bench: topoep's [G, E] tables for {} experts on {} ranks",
                             num_experts, num_ranks),
                 "use fewer ranks (--cluster)");
  // The timed rows' work on the step's batch (its ids, each row's exec ranks and scratch: the
  // balanced assignment's workspace, the dispatch layout, the exchange plan): ~48 bytes a task,
  // measured on 2026-12-04 at 2^18 and 2^21 tokens x top-8.
  const int64_t step_tokens = source.num_tokens(args.step);
  require_memory(50.0 * static_cast<double>(step_tokens) * source.top_k(),
                 fmt::format("bench: the timed operations on step {} ({} tokens x top-{})",
                             args.step, step_tokens, source.top_k()),
                 "lower --tokens-per-step, or choose another --step");

  eval::StepScratch scratch;
  const RoutingBatch batch = source.batch(args.step, args.layer, num_ranks, scratch);
  if (batch.num_tokens() == 0) {
    std::vector<int> with_tokens;  // the first few steps that hold some
    for (int s = 0; s < source.num_steps() && with_tokens.size() < 5; ++s) {
      if (source.num_tokens(s) > 0) with_tokens.push_back(s);
    }
    throw UsageError(fmt::format(
        "bench: step {} of layer {} holds no tokens; choose a --step in [0, {}) that has some "
        "({})",
        args.step, args.layer, source.num_steps(),
        with_tokens.empty() ? std::string("none has")
                            : fmt::format("e.g. {}", fmt::join(with_tokens, ", "))));
  }
  eval::StepTimingOptions options;
  options.topology = topology;
  options.slots_per_rank = slots;
  options.eps = args.eps;
  options.seed = args.seed;
  options.step = args.step;
  options.layer = args.layer;
  options.num_threads = args.threads;
  options.reps = args.reps;
  options.max_seconds = args.max_seconds;
  options.token_bytes = cost.token_bytes();
  options.expert_param_bytes = cost.expert_param_bytes();
  as_usage_error([&] {
    options.validate(batch);
    return 0;
  });
  Progress progress("bench", eval::kNumTimedOperations);
  options.on_operation = [&](const std::string&) { progress.advance(); };
  const auto ops = eval::time_step_operations(batch, options);
  progress.finish();

  const std::string workload = args.trace_path.empty() ? args.preset : args.trace_path;
  const int64_t num_tokens = batch.num_tokens();
  fmt::print(
      "cobalt bench: {} step {} layer {}: {} token{} x top-{}, E = {}, cluster {}, {} slots per "
      "rank, {} thread{}\nwall-clock ms on this machine: median and minimum of up to {} runs "
      "after one untimed run (measured, not modelled; TopoEP sizes from model {}, {})\n\n",
      workload, args.step, args.layer, num_tokens, num_tokens == 1 ? "" : "s", batch.top_k(),
      num_experts, topology.to_string(), slots, args.threads, args.threads == 1 ? "" : "s",
      args.reps, model.name, model_reason);
  fmt::print("{:<18} {:>10} {:>10} {:>5} {:>20} {:>8}  {}\n", "operation", "median_ms", "min_ms",
             "runs", "throughput", "vs_copy", "note");
  bool policy_rows = false;
  for (const auto& op : ops) {
    if (op.policy_step && !policy_rows) {
      policy_rows = true;
      fmt::print("whole policy steps (Policy::run, as `cobalt simulate` runs them):\n");
    }
    fmt::print("{:<18} {:>10.4f} {:>10.4f} {:>5} {:>20} {:>8}  {}\n", op.name, op.median_ms,
               op.min_ms, op.reps, rate(op),
               op.copy_ratio > 0 ? fmt::format("{:.1f}%", 100 * op.copy_ratio) : "", op.note);
  }
  fmt::print(
      "\nvs_copy: copy_bound's median / the operation's (the share of the memory-copy floor of "
      "the same bytes it reaches); V: cross-node token transfers of the step; layout floor: the "
      "lowest imbalance any assignment reaches on that layout\n");
  if (args.json_path.empty()) return;
  nlohmann::json doc;
  doc["workload"] = workload;
  doc["step"] = args.step;
  doc["layer"] = args.layer;
  doc["num_tokens"] = batch.num_tokens();
  doc["top_k"] = batch.top_k();
  doc["num_experts"] = num_experts;
  doc["cluster"] = topology.to_string();
  doc["slots_per_rank"] = slots;
  doc["threads"] = args.threads;
  doc["reps"] = args.reps;
  doc["max_seconds"] = args.max_seconds;
  doc["eps"] = args.eps;
  if (args.replica_slots) {
    doc["replica_slots"] = *args.replica_slots;
  } else {
    doc["rho"] = args.rho;
  }
  if (args.steps) doc["steps"] = *args.steps;
  if (args.tokens_per_step) doc["tokens_per_step"] = *args.tokens_per_step;
  doc["seed"] = args.seed;
  doc["model"] = model.name;
  doc["model_reason"] = model_reason;
  doc["timing"] = "wall-clock, measured on this machine";
  doc["operations"] = nlohmann::json::array();
  for (const auto& op : ops) {
    nlohmann::json o = {{"name", op.name},
                        {"what", op.what},
                        {"median_ms", op.median_ms},
                        {"min_ms", op.min_ms},
                        {"reps", op.reps},
                        {"note", op.note},
                        {"copy_ratio", op.copy_ratio},
                        {"policy_step", op.policy_step}};
    if (op.items > 0) {
      o["items"] = op.items;
      o["unit"] = op.unit;
      o["items_per_s"] = op.items / (op.median_ms * 1e-3);
    }
    doc["operations"].push_back(std::move(o));
  }
  io::write_file_atomically(
      args.json_path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
      "--json");
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Time the per-step work (library calls and whole policy steps) on one batch of a trace");
  add_workload_options(cmd, args->trace_path, args->preset, args->steps, args->tokens_per_step);
  cmd->add_option("--cluster", args->cluster, "NxM: N nodes of M ranks, or a cluster preset's name")
      ->capture_default_str();
  cmd->add_option("--step", args->step, "step whose batch is timed")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxInt));
  cmd->add_option("--layer", args->layer, "MoE layer whose batch is timed")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxInt));
  add_budget_options(cmd, args->rho, args->replica_slots);
  cmd->add_option("--eps", args->eps, "load tolerance (1+eps) x mean for the global planner")
      ->capture_default_str()
      ->transform(number_in(0, kMaxEps));
  cmd->add_option("--model", args->model,
                  "model sizes for TopoEP's benefit rule (default: as `cobalt simulate`)")
      ->check(non_empty_value());
  cmd->add_option("--threads", args->threads,
                  "worker threads (statistics, planner restarts, assignments; the other calls run "
                  "on one; a preset is generated on every core, before anything is timed)")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxThreads));
  cmd->add_option("--reps", args->reps, "timed runs of each row (after one untimed run)")
      ->capture_default_str()
      ->transform(integer_in(1, 100000));
  cmd->add_option("--max-seconds", args->max_seconds,
                  "a row stops repeating once its timed runs took this long (at least one run)")
      ->capture_default_str()
      ->transform(number_in(1e-3, 1e6));
  cmd->add_option("--seed", args->seed, "seed for generation and the assignment's draws")
      ->capture_default_str()
      ->transform(seed_value());
  cmd->add_option("--json", args->json_path, "also write the timings as JSON")
      ->check(non_empty_path());
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace cobalt::cli
