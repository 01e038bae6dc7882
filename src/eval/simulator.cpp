#include "cobalt/eval/simulator.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/assignment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::eval {
namespace {

// What one (step, layer) of one policy produced.
struct LayerOutcome {
  CrossNodeTransfers transfers;
  bool has_tasks = true;  // imbalance and MaxVio are undefined for a layer without tasks
  double imbalance = 1, max_violation = 0;
  double imbalance_floor = 1;  // the lowest imbalance any assignment reaches on the layout
  double imbalance_bound = 1;  // ... any layout and assignment reaches (whole tasks)
  TimeBreakdown time;          // this layer's share of the step (planning is per step)
  double migration_bytes = 0, migration_cross_node_bytes = 0, grad_sync_bytes = 0;
  int64_t moves_cross_node = 0, moves_intra_node = 0;
  double replicas_per_expert = 1;
};

// Per-layer replay state of one policy: the previous layout (for migration) and the gradient
// synchronisation cost of the layout in force (recomputed only when the layout changes).
struct LayerState {
  std::shared_ptr<const ExpertLayout> layout;
  std::vector<RankId> mains;  // [E] main instance of every expert
  double grad_sync_s = 0, grad_sync_bytes = 0;
};

// Layout-dependent costs: migration from the previous layout, gradient synchronisation.
void add_layout_costs(const std::shared_ptr<const ExpertLayout>& layout, const CostParams& cost,
                      LayerState& state, LayerOutcome& out) {
  const bool changed = state.layout != layout && (!state.layout || !(*state.layout == *layout));
  if (!state.layout) {
    state.mains = initial_main_ranks(*layout);
  } else if (changed) {
    std::vector<RankId> mains = next_main_ranks(*layout, state.mains);
    const LayoutDiff d = diff(*state.layout, *layout);
    const LinkBytes moved = migration_bytes(d, state.mains, mains, layout->topology(), cost);
    state.mains = std::move(mains);
    out.time.migration_s = link_time(moved, cost).time_s();
    out.migration_cross_node_bytes = moved.total_inter();
    out.migration_bytes = moved.total_inter() + moved.total_intra();
    out.moves_cross_node = d.num_cross_node;
    out.moves_intra_node = d.num_intra_node;
  }
  if (changed || !state.layout) {
    const LinkBytes sync = grad_sync_bytes(*layout, state.mains, cost);
    state.grad_sync_s = link_time(sync, cost).time_s();
    state.grad_sync_bytes = sync.total_inter() + sync.total_intra();
  }
  state.layout = layout;
  out.time.grad_sync_s = state.grad_sync_s;
  out.grad_sync_bytes = state.grad_sync_bytes;
  out.replicas_per_expert = static_cast<double>(layout->num_replicas()) / layout->num_experts();
}

// Compute and exchange time from the rank loads and (token sources) the exchange volume.
void add_layer_time(std::span<const int64_t> rank_loads, const ExchangeVolume* volume,
                    const CostParams& cost, LayerOutcome& out) {
  out.time.compute_s = compute_time(rank_loads, cost);
  const double exchange_s =
      volume ? link_time(exchange_bytes(*volume, cost.token_bytes()), cost).time_s() : 0.0;
  out.time.exchange_s = layer_time(out.time.compute_s, exchange_s, cost) - out.time.compute_s;
}

LayerOutcome run_token_layer(policy::Policy& pol, const StepSource& source, int step, int layer,
                             const SimulationOptions& options, StepScratch& scratch,
                             std::vector<RankId>& exec, LayerState& state) {
  const auto& config = options.policy_config;
  RoutingBatch batch = source.batch(step, layer, config.topology.num_ranks(), scratch);
  exec.assign(batch.num_tasks(), -1);
  auto layout = pol.run(step, layer, batch, exec);
  // validate_assignment, step_metrics and exchange_volume in one pass.
  const LayerReplay replay = replay_layer(batch, *layout, exec, config.topology);
  LayerOutcome out;
  out.has_tasks = batch.num_tasks() > 0;
  const StepMetrics& m = replay.metrics;
  out.transfers = m.transfers;
  out.imbalance = m.imbalance;
  out.max_violation = m.max_violation;
  out.imbalance_floor = imbalance_floor(m.expert_counts, *layout);
  out.imbalance_bound = whole_task_imbalance_bound(batch.num_tasks(), config.topology.num_ranks());
  add_layer_time(m.rank_loads, &replay.volume, options.cost, out);
  add_layout_costs(layout, options.cost, state, out);
  if (options.observer) options.observer->on_step(step, layer, batch, exec, *layout);
  return out;
}

LayerOutcome run_load_layer(policy::Policy& pol, const StepSource& source, int step, int layer,
                            const SimulationOptions& options, StepScratch& scratch,
                            std::vector<int64_t>& counts, LayerState& state) {
  const auto& config = options.policy_config;
  const int num_ranks = config.topology.num_ranks(), num_experts = config.num_experts;
  counts.assign(static_cast<size_t>(num_ranks) * num_experts, 0);
  source.loads(step, layer, num_ranks, counts, scratch);
  std::vector<int64_t> loads(num_ranks, 0), expert_counts(num_experts, 0);
  auto layout = pol.run_loads(step, layer, counts, loads);
  for (size_t i = 0; i < counts.size(); ++i) expert_counts[i % num_experts] += counts[i];
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  COBALT_CHECK_INTERNAL(std::accumulate(loads.begin(), loads.end(), int64_t{0}) == total,
                        "policy {}: rank loads of step {} layer {} do not add up to {} tasks",
                        pol.name(), step, layer, total);
  LayerOutcome out;
  out.has_tasks = total > 0;
  out.imbalance = imbalance(loads);
  out.max_violation = max_violation(expert_counts);
  out.imbalance_floor = imbalance_floor(expert_counts, *layout);
  out.imbalance_bound = whole_task_imbalance_bound(total, num_ranks);
  add_layer_time(loads, nullptr, options.cost, out);
  add_layout_costs(layout, options.cost, state, out);
  return out;
}

void add_time(TimeBreakdown& into, const TimeBreakdown& t, double scale = 1.0) {
  into.compute_s += scale * t.compute_s;
  into.exchange_s += scale * t.exchange_s;
  into.grad_sync_s += scale * t.grad_sync_s;
  into.migration_s += scale * t.migration_s;
  into.planning_s += scale * t.planning_s;
}

// Why a token-level policy does not replay a load-only trace (PolicyResult::skipped).
constexpr const char* kNeedsTokenIds =
    "needs per-token expert ids (topk_ids); this trace is load-only (counts)";

PolicyResult replay_policy(policy::Policy& pol, const StepSource& source,
                           const SimulationOptions& options, const std::function<void()>& tick) {
  const auto& config = options.policy_config;
  const int num_steps = source.num_steps(), num_layers = config.num_layers;
  PolicyResult pr;
  pr.name = pol.name();
  pr.has_token_metrics = source.has_tokens();
  pr.step_cross_node_tokens.assign(num_steps, 0);
  pr.step_imbalance.assign(num_steps, 0.0);
  pr.step_time_s.assign(num_steps, 0.0);
  if (!source.has_tokens() && pol.needs_token_ids()) {
    pr.skipped = kNeedsTokenIds;
    for (int s = 0; s < num_steps; ++s) tick();
    return pr;
  }
  if (options.observer) options.observer->begin_policy(pr.name);
  std::vector<LayerState> states(num_layers);
  StepScratch scratch;
  std::vector<RankId> exec;
  std::vector<int64_t> counts;
  double imbalance_sum = 0, imbalance_floor_sum = 0, imbalance_bound_sum = 0, maxvio_sum = 0,
         replicas_sum = 0, grad_sync_bytes = 0;
  int64_t measured_layers = 0, measured_steps = 0;
  int64_t balance_layers = 0;  // measured layers with tasks (imbalance and MaxVio are defined)
  double previous_busy_s = 0;  // modelled time of the previous step without planning
  for (int s = 0; s < num_steps; ++s) {
    const double planner_before = pol.counters().planner_wall_ms;
    const double async_before = pol.counters().async_plan_ms;
    const bool measured = s >= options.warmup_steps;
    TimeBreakdown step_time;
    double step_imbalance_sum = 0;
    int step_layers_with_tasks = 0;
    for (int l = 0; l < num_layers; ++l) {
      const LayerOutcome o =
          source.has_tokens()
              ? run_token_layer(pol, source, s, l, options, scratch, exec, states[l])
              : run_load_layer(pol, source, s, l, options, scratch, counts, states[l]);
      pr.step_cross_node_tokens[s] += o.transfers.dedup;
      if (o.has_tasks) {
        step_imbalance_sum += o.imbalance;
        ++step_layers_with_tasks;
      }
      add_time(step_time, o.time);
      if (!measured) continue;
      pr.cross_node_tokens += o.transfers.dedup;
      pr.cross_node_tokens_no_dedup += o.transfers.no_dedup;
      if (o.has_tasks) {
        imbalance_sum += o.imbalance;
        pr.imbalance_max = std::max(pr.imbalance_max, o.imbalance);
        imbalance_floor_sum += o.imbalance_floor;
        imbalance_bound_sum += o.imbalance_bound;
        maxvio_sum += o.max_violation;
        ++balance_layers;
      }
      replicas_sum += o.replicas_per_expert;
      pr.migration_bytes += o.migration_bytes;
      pr.migration_cross_node_bytes += o.migration_cross_node_bytes;
      pr.migrated_replicas_cross_node += o.moves_cross_node;
      pr.migrated_replicas_intra_node += o.moves_intra_node;
      grad_sync_bytes += o.grad_sync_bytes;
      ++measured_layers;
    }
    pr.step_imbalance[s] = step_layers_with_tasks > 0 ? step_imbalance_sum / step_layers_with_tasks
                                                      : std::numeric_limits<double>::quiet_NaN();
    // A background plan launched during the previous step ran while that step trained: of its cost
    // (PolicyCounters::async_plan_ms: its thread's CPU time, not the replay's wait for it, which
    // shrinks with however long the replay took meanwhile), only what outlasts the previous step's
    // modelled time stalls this one. Everything else a policy does to decide (synchronous
    // planning) is on the critical path.
    const double async_ms = pol.counters().async_plan_ms - async_before;
    const double sync_ms = pol.counters().planner_wall_ms - planner_before - async_ms;
    step_time.planning_s = step_planning_time(sync_ms, async_ms, previous_busy_s, options.cost);
    previous_busy_s = step_time.total() - step_time.planning_s;
    pr.step_time_s[s] = step_time.total();
    if (measured) {
      add_time(pr.time, step_time);
      ++measured_steps;
    }
    tick();
  }
  if (options.observer) options.observer->end_policy(pr.name);
  if (balance_layers > 0) {
    pr.imbalance_mean = imbalance_sum / balance_layers;
    pr.imbalance_floor_mean = imbalance_floor_sum / balance_layers;
    pr.imbalance_bound_mean = imbalance_bound_sum / balance_layers;
    pr.maxvio_mean = maxvio_sum / balance_layers;
  }
  if (measured_layers > 0) pr.replicas_per_expert_mean = replicas_sum / measured_layers;
  if (measured_steps > 0) {
    TimeBreakdown mean;
    add_time(mean, pr.time, 1.0 / measured_steps);
    pr.time = mean;
    pr.grad_sync_bytes = grad_sync_bytes / measured_steps;
  }
  pr.sim_step_time_s = pr.time.total();
  pr.cross_node_bytes = static_cast<double>(pr.cross_node_tokens) * options.cost.token_bytes() *
                        options.cost.exchanges_per_layer;
  pr.counters = pol.counters();
  pr.planner_wall_ms = pr.counters.planner_wall_ms;
  for (const auto& st : states) pr.final_layouts.push_back(st.layout);
  return pr;
}

}  // namespace

namespace {

// cobalt and cobalt+: Algorithm 1's node cover, routing statistics per layer.
bool is_cobalt_family(const std::string& policy) {
  return policy == "cobalt" || policy == "cobalt+";
}

}  // namespace

int policy_max_top_k(const std::string& policy) {
  return is_cobalt_family(policy) ? assign::kMaxNodeCoverTopK : std::numeric_limits<int>::max();
}

std::vector<std::string> policies_over_top_k(const std::vector<std::string>& policies, int top_k) {
  std::vector<std::string> out;
  for (const auto& name : policies) {
    if (top_k > policy_max_top_k(name)) out.push_back(name);
  }
  return out;
}

double simulation_memory_bytes(const StepSource& source, const SimulationOptions& options,
                               std::string* breakdown) {
  // The policies replay one at a time and each is freed after its replay: the largest counts.
  std::string largest;
  policy::PolicyMemory largest_memory;
  bool balanced = false;
  for (const auto& name : options.policies) {
    balanced = balanced || name == "cobalt+";
    const policy::PolicyMemory memory = policy::policy_memory(name, options.policy_config);
    if (largest.empty() || memory.total_bytes() > largest_memory.total_bytes()) {
      largest = name;
      largest_memory = memory;
    }
  }
  double total = largest_memory.total_bytes();
  // The largest step's work (the policies take turns on it).
  int64_t max_step_tokens = 0;
  if (source.has_tokens()) {
    for (int s = 0; s < source.num_steps(); ++s) {
      max_step_tokens = std::max(max_step_tokens, source.num_tokens(s));
    }
  }
  const double step_work =
      (balanced ? 16.0 : 10.0) * static_cast<double>(max_step_tokens) * source.top_k();
  total += step_work;
  if (breakdown != nullptr) {
    const auto& config = options.policy_config;
    *breakdown = largest.empty()
                     ? std::string("no policy")
                     : fmt::format(
                           "the largest policy, {}, {}: {} a layer x {} layer{} + {} once for E = "
                           "{} experts on G = {} ranks{}",
                           largest, format_bytes(largest_memory.total_bytes()),
                           format_bytes(largest_memory.per_layer_bytes), largest_memory.num_layers,
                           largest_memory.num_layers == 1 ? "" : "s",
                           format_bytes(largest_memory.working_bytes), config.num_experts,
                           config.topology.num_ranks(),
                           config.async_planning ? " with async plan snapshots" : "");
    *breakdown += fmt::format("; the largest step's work {} ({} tokens x top-{})",
                              format_bytes(step_work), max_step_tokens, source.top_k());
  }
  return total;
}

SimulationResult simulate(const StepSource& source, const SimulationOptions& options) {
  const auto& config = options.policy_config;
  COBALT_CHECK_ARG(source.num_experts() == config.num_experts && source.top_k() == config.top_k &&
                       source.num_layers() == config.num_layers,
                   "simulate: trace has E={} K={} L={}, policy config E={} K={} L={}",
                   source.num_experts(), source.top_k(), source.num_layers(), config.num_experts,
                   config.top_k, config.num_layers);
  COBALT_CHECK_ARG(!options.policies.empty(), "simulate: no policies given (valid: {})",
                   fmt::format("{}", fmt::join(policy::policy_names(), ", ")));
  options.cost.validate();
  const int num_steps = source.num_steps();
  COBALT_CHECK_ARG(options.warmup_steps >= 0 && options.warmup_steps < num_steps,
                   "simulate: warm-up steps {} out of range [0, {}) for a trace of {} steps",
                   options.warmup_steps, num_steps, num_steps);
  SimulationResult result;
  result.num_experts = config.num_experts;
  result.top_k = config.top_k;
  result.num_layers = config.num_layers;
  result.num_steps = num_steps;
  result.load_only = !source.has_tokens();
  for (int s = 0; s < num_steps; ++s) result.num_tokens += source.num_tokens(s);
  result.first_measured_step = options.warmup_steps;
  const auto over = policies_over_top_k(options.policies, config.top_k);
  if (source.has_tokens()) {
    COBALT_CHECK_ARG(over.empty(),
                     "simulate: policy {} replays top-k <= {} (Algorithm 1's node cover); the "
                     "workload has top-k {}",
                     fmt::join(over, ", "), assign::kMaxNodeCoverTopK, config.top_k);
  }
  // On a load-only trace these would be skipped for want of token ids; above their top-k they
  // cannot even be built (make_policy refuses them), so they are skipped unbuilt.
  const auto unbuilt = [&](const std::string& name) {
    return std::find(over.begin(), over.end(), name) != over.end();
  };
  // Fail early on unknown names and bad configurations before doing any work: each policy is
  // built once and freed. Then each is built again right before its replay and freed after it,
  // so the policies' state does not add up (cobalt's statistics are allocated when it is built).
  for (const auto& name : options.policies) {
    if (!unbuilt(name)) policy::make_policy(name, config);
  }

  const int64_t total_work = static_cast<int64_t>(options.policies.size()) * num_steps;
  int64_t done = 0;
  auto tick = [&] {
    if (options.progress) options.progress(++done, total_work);
  };
  for (const auto& name : options.policies) {
    if (unbuilt(name)) {
      PolicyResult skipped;
      skipped.name = name;
      skipped.has_token_metrics = false;
      skipped.skipped = kNeedsTokenIds;
      for (int s = 0; s < num_steps; ++s) tick();
      result.policies.push_back(std::move(skipped));
      continue;
    }
    std::unique_ptr<policy::Policy> pol = policy::make_policy(name, config);
    try {
      result.policies.push_back(replay_policy(*pol, source, options, tick));
    } catch (const Error& e) {
      // A policy that cannot replay load-only data says so with kFailedPrecondition: report it
      // as skipped instead of failing the whole comparison.
      if (source.has_tokens() || e.code() != ErrorCode::kFailedPrecondition) throw;
      PolicyResult skipped;
      skipped.name = pol->name();
      skipped.has_token_metrics = false;
      skipped.skipped = e.what();
      result.policies.push_back(std::move(skipped));
    }
  }

  const auto it = std::find_if(result.policies.begin(), result.policies.end(),
                               [](const PolicyResult& p) { return p.name == "static"; });
  if (it != result.policies.end() && it->skipped.empty()) {
    const PolicyResult base = *it;
    for (auto& p : result.policies) {
      if (!p.skipped.empty()) continue;
      if (base.cross_node_tokens > 0) {
        p.cross_node_reduction_vs_static = 1.0 - static_cast<double>(p.cross_node_tokens) /
                                                     static_cast<double>(base.cross_node_tokens);
        p.has_reduction_vs_static = true;
      }
      if (p.sim_step_time_s > 0) p.speedup_vs_static = base.sim_step_time_s / p.sim_step_time_s;
    }
  }
  return result;
}

}  // namespace cobalt::eval
