// simulate --json: DESIGN.md §3.2's schema plus the cost model's inputs and breakdown.
#include <nlohmann/json.hpp>

#include "cobalt/eval/report.hpp"

namespace cobalt::eval {
namespace {

nlohmann::json scenario_json(const Scenario& sc, const SimulationResult& result) {
  nlohmann::json s;
  s["workload"] = sc.workload;
  s["cluster"] = sc.cluster;
  s["cluster_preset"] = sc.cluster_preset;
  s["model"] = {{"name", sc.model.name},
                {"reason", sc.model_reason},
                {"hidden_size", sc.model.hidden_size},
                {"expert_ffn_size", sc.model.expert_ffn_size},
                {"num_experts", sc.model.num_experts},
                {"top_k", sc.model.top_k},
                {"num_moe_layers", sc.model.num_moe_layers},
                {"bytes_per_element", sc.model.bytes_per_element},
                {"source", sc.model.source}};
  const CostParams& c = sc.cost;
  std::string note =
      "times are modelled (DESIGN.md §5 cost model), not measured; they cover the MoE layers "
      "that were replayed";
  if (const std::string planning = planning_time_note(sc.cost);
      !planning.empty() && !result.load_only)
    note += "; " + planning;
  s["cost_model"] = {{"note", note},
                     {"nvlink_bytes_per_s", c.nvlink_bytes_per_s},
                     {"ib_bytes_per_s_per_node", c.ib_bytes_per_s_per_node},
                     {"achievable_flops_per_gpu", c.achievable_flops},
                     {"token_bytes", c.token_bytes()},
                     {"flops_per_task", c.flops_per_task()},
                     {"expert_param_bytes", c.expert_param_bytes()},
                     {"matmuls_per_expert", c.matmuls_per_expert},
                     {"fwd_bwd_flops_factor", c.fwd_bwd_flops_factor},
                     {"exchanges_per_layer", c.exchanges_per_layer},
                     {"overlap_fraction", c.overlap_fraction},
                     {"grad_bytes_per_element", c.grad_bytes_per_element},
                     {"param_refresh", c.param_refresh},
                     {"optimizer_factor", c.optimizer_factor},
                     {"planner_time_scale", c.planner_time_scale},
                     {"planner_overlap", c.planner_overlap}};
  s["num_experts"] = result.num_experts;
  s["top_k"] = result.top_k;
  s["num_layers"] = result.num_layers;
  s["num_steps"] = result.num_steps;
  // null for load-only traces: they have task counts, not tokens.
  s["num_tokens"] = result.load_only ? nlohmann::json(nullptr) : nlohmann::json(result.num_tokens);
  s["load_only"] = result.load_only;
  s["chunking"] = {{"mode", sc.chunks.mode},
                   {"trace_steps", sc.chunks.trace_steps},
                   {"trace_tokens", sc.chunks.trace_tokens},
                   {"passes", sc.chunks.passes}};
  if (sc.holdout) s["holdout"] = *sc.holdout;
  s["slots_per_rank"] = sc.slots_per_rank;
  if (sc.rho >= 0) s["rho"] = sc.rho;
  if (sc.replica_slots >= 0) s["replica_slots"] = sc.replica_slots;
  s["eps"] = sc.eps;
  s["steps_per_global_plan"] = sc.steps_per_global_plan;
  s["seed"] = sc.seed;
  s["async_planning"] = sc.async_planning;
  s["layout_pricing"] = sc.layout_pricing;
  s["measured_steps"] = {result.first_measured_step, result.num_steps};
  s["notes"] = sc.notes;
  return s;
}

// A number, or null when the trace cannot support it.
nlohmann::json maybe(bool present, double value) {
  return present ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json policy_json(const PolicyResult& p) {
  nlohmann::json o;
  o["name"] = p.name;
  const bool ran = p.skipped.empty();
  if (!ran) o["skipped"] = p.skipped;
  const bool tok = ran && p.has_token_metrics;
  o["cross_node_tokens"] = tok ? nlohmann::json(p.cross_node_tokens) : nlohmann::json(nullptr);
  o["cross_node_tokens_no_dedup"] =
      tok ? nlohmann::json(p.cross_node_tokens_no_dedup) : nlohmann::json(nullptr);
  o["cross_node_bytes"] = maybe(tok, p.cross_node_bytes);
  o["cross_node_reduction_vs_static"] =
      maybe(tok && p.has_reduction_vs_static, p.cross_node_reduction_vs_static);
  o["imbalance_mean"] = maybe(ran, p.imbalance_mean);
  o["imbalance_max"] = maybe(ran, p.imbalance_max);
  o["imbalance_floor_mean"] = maybe(ran, p.imbalance_floor_mean);
  o["imbalance_bound_mean"] = maybe(ran, p.imbalance_bound_mean);
  o["maxvio_mean"] = maybe(ran, p.maxvio_mean);
  o["sim_step_time_s"] = maybe(tok, p.sim_step_time_s);
  o["speedup_vs_static"] = maybe(tok && p.speedup_vs_static > 0, p.speedup_vs_static);
  o["time_breakdown_s"] = {{"compute", maybe(ran, p.time.compute_s)},
                           {"exchange", maybe(tok, p.time.exchange_s)},
                           {"grad_sync", maybe(ran, p.time.grad_sync_s)},
                           {"migration", maybe(ran, p.time.migration_s)},
                           {"planning", maybe(ran, p.time.planning_s)}};
  o["planner_wall_ms"] = maybe(ran, p.planner_wall_ms);
  o["migration_bytes"] = maybe(ran, p.migration_bytes);
  o["migration_cross_node_bytes"] = maybe(ran, p.migration_cross_node_bytes);
  // Counts: null for a skipped policy (ran and moved nothing is 0).
  const auto count = [ran](int64_t value) {
    return ran ? nlohmann::json(value) : nlohmann::json(nullptr);
  };
  o["migrated_replicas_cross_node"] = count(p.migrated_replicas_cross_node);
  o["migrated_replicas_intra_node"] = count(p.migrated_replicas_intra_node);
  o["grad_sync_bytes_per_step"] = maybe(ran, p.grad_sync_bytes);
  o["replicas_per_expert_mean"] = maybe(ran, p.replicas_per_expert_mean);
  o["num_global_plans"] = count(p.counters.num_global_plans);
  o["intra_node_moves"] = count(p.counters.intra_node_moves);
  o["cross_node_moves"] = count(p.counters.cross_node_moves);
  o["step_cross_node_tokens"] =
      tok ? nlohmann::json(p.step_cross_node_tokens) : nlohmann::json(nullptr);
  o["step_imbalance"] = ran ? nlohmann::json(p.step_imbalance) : nlohmann::json(nullptr);
  o["step_sim_time_s"] = tok ? nlohmann::json(p.step_time_s) : nlohmann::json(nullptr);
  return o;
}

}  // namespace

int best_policy_index(const SimulationResult& result) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(result.policies.size()); ++i) {
    const auto& p = result.policies[i];
    if (!p.skipped.empty()) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const auto& b = result.policies[best];
    const bool better = p.has_token_metrics ? p.sim_step_time_s < b.sim_step_time_s
                                            : p.imbalance_mean < b.imbalance_mean;
    if (better) best = i;
  }
  return best;
}

std::string simulation_json(const Scenario& scenario, const SimulationResult& result) {
  nlohmann::json j;
  j["scenario"] = scenario_json(scenario, result);
  j["policies"] = nlohmann::json::array();
  for (const auto& p : result.policies) j["policies"].push_back(policy_json(p));
  const int best = best_policy_index(result);
  j["best_policy"] =
      best >= 0 ? nlohmann::json(result.policies[best].name) : nlohmann::json(nullptr);
  // Invalid UTF-8 (e.g. in a file name) becomes U+FFFD instead of failing after the run.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace cobalt::eval
