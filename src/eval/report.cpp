#include "cobalt/eval/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace cobalt::eval {

std::string simulation_json(const Scenario& scenario, const SimulationResult& result) {
  nlohmann::json j;
  auto& s = j["scenario"];
  s["workload"] = scenario.workload;
  s["cluster"] = scenario.cluster;
  s["num_experts"] = result.num_experts;
  s["top_k"] = result.top_k;
  s["num_layers"] = result.num_layers;
  s["num_steps"] = result.num_steps;
  s["num_tokens"] = result.num_tokens;
  s["slots_per_rank"] = scenario.slots_per_rank;
  if (scenario.rho >= 0) s["rho"] = scenario.rho;
  if (scenario.replica_slots >= 0) s["replica_slots"] = scenario.replica_slots;
  s["eps"] = scenario.eps;
  s["steps_per_global_plan"] = scenario.steps_per_global_plan;
  s["seed"] = scenario.seed;
  s["measured_steps"] = {result.first_measured_step, result.num_steps};
  auto& list = j["policies"];
  list = nlohmann::json::array();
  for (const auto& p : result.policies) {
    nlohmann::json o;
    o["name"] = p.name;
    o["cross_node_tokens"] = p.cross_node_tokens;
    o["cross_node_tokens_no_dedup"] = p.cross_node_tokens_no_dedup;
    o["cross_node_reduction_vs_static"] = p.cross_node_reduction_vs_static;
    o["imbalance_mean"] = p.imbalance_mean;
    o["imbalance_max"] = p.imbalance_max;
    o["maxvio_mean"] = p.maxvio_mean;
    o["planner_wall_ms"] = p.planner_wall_ms;
    o["num_global_plans"] = p.counters.num_global_plans;
    o["intra_node_moves"] = p.counters.intra_node_moves;
    o["cross_node_moves"] = p.counters.cross_node_moves;
    o["step_cross_node_tokens"] = p.step_cross_node_tokens;
    o["step_imbalance"] = p.step_imbalance;
    list.push_back(std::move(o));
  }
  return j.dump(2);
}

std::string simulation_table(const Scenario& scenario, const SimulationResult& result) {
  std::string out = fmt::format(
      "workload {} | cluster {} | E={} K={} L={} | {} steps, {} tokens | measured steps [{}, {}) | "
      "{} slots/rank, "
      "eps {}\n",
      scenario.workload, scenario.cluster, result.num_experts, result.top_k, result.num_layers,
      result.num_steps, result.num_tokens, result.first_measured_step, result.num_steps,
      scenario.slots_per_rank, scenario.eps);
  const auto& ps = result.policies;
  auto min_of = [&](auto get) {
    double best = 1e300;
    for (const auto& p : ps) best = std::min(best, static_cast<double>(get(p)));
    return best;
  };
  const double best_v = min_of([](const PolicyResult& p) { return p.cross_node_tokens; });
  const double best_im = min_of([](const PolicyResult& p) { return p.imbalance_mean; });
  const double best_ix = min_of([](const PolicyResult& p) { return p.imbalance_max; });
  const double best_mv = min_of([](const PolicyResult& p) { return p.maxvio_mean; });
  auto mark = [](bool best) { return best ? "*" : " "; };
  out += fmt::format("{:<12} {:>16}  {:>10}  {:>9}  {:>9}  {:>9}  {:>11}  {:>13}\n", "policy",
                     "cross-node tok", "vs static", "imb mean", "imb max", "MaxVio", "planner ms",
                     "moves x/intra");
  for (const auto& p : ps) {
    out += fmt::format(
        "{:<12} {:>15}{}  {:>9.1f}%  {:>8.3f}{}  {:>8.3f}{}  {:>8.3f}{}  {:>11.1f}  {:>6}/{:<6}\n",
        p.name, p.cross_node_tokens, mark(p.cross_node_tokens == best_v),
        100.0 * p.cross_node_reduction_vs_static, p.imbalance_mean,
        mark(p.imbalance_mean == best_im), p.imbalance_max, mark(p.imbalance_max == best_ix),
        p.maxvio_mean, mark(p.maxvio_mean == best_mv), p.planner_wall_ms,
        p.counters.cross_node_moves, p.counters.intra_node_moves);
  }
  out += "(* best in column; MaxVio is a property of the routing, identical across policies)\n";
  return out;
}

}  // namespace cobalt::eval
