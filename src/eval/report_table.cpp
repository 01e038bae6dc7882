// The terminal comparison: exact replay metrics, then the modelled time per step.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "cobalt/eval/report.hpp"

namespace cobalt::eval {
namespace {

using Getter = std::function<double(const PolicyResult&)>;

// Lowest value of `get` over the policies that ran (for the '*' marks).
double best_of(const SimulationResult& result, const Getter& get) {
  double best = 1e300;
  for (const auto& p : result.policies) {
    if (p.skipped.empty()) best = std::min(best, get(p));
  }
  return best;
}

const char* mark(double value, double best) { return value == best ? "*" : " "; }

// `value` right-aligned in `width` with `precision` decimals, or in exponent notation when that
// would not fit a column (|value| >= 1e9, inf, nan): a column never grows to hundreds of digits.
std::string fixed(double value, int width, int precision) {
  if (std::isfinite(value) && std::abs(value) < 1e9) {
    return fmt::format("{:>{}.{}f}", value, width, precision);
  }
  return fmt::format("{:>{}.3g}", value, width);
}

std::string header(const Scenario& sc, const SimulationResult& r) {
  std::string out = fmt::format(
      "workload {} | cluster {} ({}) | model {} (hidden {}, expert FFN {}) | E={} K={} L={}\n"
      "{} steps, {} ({}) | measured steps [{}, {}) | {} slots/rank, eps {} | P {}{}\n",
      sc.workload, sc.cluster, sc.cluster_preset, sc.model.name, sc.cost.hidden_size,
      sc.cost.expert_ffn_size, r.num_experts, r.top_k, r.num_layers, r.num_steps,
      r.load_only ? std::string("load-only counts") : fmt::format("{} tokens", r.num_tokens),
      sc.chunks.mode == "trace" ? "trace steps" : sc.chunks.mode, r.first_measured_step,
      r.num_steps, sc.slots_per_rank, sc.eps, sc.steps_per_global_plan,
      std::string(sc.async_planning ? " | async planning" : "") +
          (sc.layout_pricing ? " | priced layouts" : ""));
  for (const auto& note : sc.notes) out += fmt::format("note: {}\n", note);
  return out;
}

std::string metrics_table(const SimulationResult& r) {
  const bool tok = !r.load_only;
  const double best_v = best_of(r, [](const PolicyResult& p) { return p.cross_node_tokens; });
  const double best_im = best_of(r, [](const PolicyResult& p) { return p.imbalance_mean; });
  const double best_ix = best_of(r, [](const PolicyResult& p) { return p.imbalance_max; });
  std::string out =
      fmt::format("{:<14} {:>15}  {:>9}  {:>13}  {:>9}  {:>9}  {:>9}  {:>11}  {:>13}\n", "policy",
                  "cross-node tok", "vs static", "cross-node GB", "imb mean", "imb max",
                  "imb floor", "planner ms", "moves x/intra");
  for (const auto& p : r.policies) {
    if (!p.skipped.empty()) {
      out += fmt::format("{:<14} skipped: {}\n", p.name, p.skipped);
      continue;
    }
    const std::string v =
        tok ? fmt::format("{:>14}{}", p.cross_node_tokens, mark(p.cross_node_tokens, best_v))
            : fmt::format("{:>15}", "n/a");
    const std::string vs = tok && p.has_reduction_vs_static
                               ? fmt::format("{:>8.1f}%", 100.0 * p.cross_node_reduction_vs_static)
                               : fmt::format("{:>9}", "n/a");
    const std::string gb =
        tok ? fixed(p.cross_node_bytes / 1e9, 13, 2) : fmt::format("{:>13}", "n/a");
    out += fmt::format("{:<14} {}  {}  {}  {:>8.3f}{}  {:>8.3f}{}  {:>9.3f}  {}  {:>6}/{}\n",
                       p.name, v, vs, gb, p.imbalance_mean, mark(p.imbalance_mean, best_im),
                       p.imbalance_max, mark(p.imbalance_max, best_ix), p.imbalance_floor_mean,
                       fixed(p.planner_wall_ms, 11, 1), p.migrated_replicas_cross_node,
                       p.migrated_replicas_intra_node);
  }
  return out;
}

std::string time_table(const SimulationResult& r) {
  const bool tok = !r.load_only;
  std::string out = fmt::format("modelled time per step, ms (cost model, not measured){}:\n",
                                tok ? "" : " — load-only trace: no exchange time, so no step time");
  out += fmt::format("{:<14} {:>10}  {:>8}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}\n", "policy", "step",
                     "speedup", "compute", "exchange", "grad sync", "migration", "planning");
  const std::vector<Getter> parts = {[](const PolicyResult& p) { return p.time.compute_s; },
                                     [](const PolicyResult& p) { return p.time.exchange_s; },
                                     [](const PolicyResult& p) { return p.time.grad_sync_s; },
                                     [](const PolicyResult& p) { return p.time.migration_s; },
                                     [](const PolicyResult& p) { return p.time.planning_s; }};
  std::vector<double> best;
  for (const auto& get : parts) best.push_back(best_of(r, get));
  const double best_step = best_of(r, [](const PolicyResult& p) { return p.sim_step_time_s; });
  for (const auto& p : r.policies) {
    if (!p.skipped.empty()) continue;
    std::string line = fmt::format("{:<14} ", p.name);
    if (tok) {
      line += fmt::format("{}{}  ", fixed(1e3 * p.sim_step_time_s, 9, 2),
                          mark(p.sim_step_time_s, best_step));
      line += p.speedup_vs_static > 0 ? fmt::format("{:>7.2f}x  ", p.speedup_vs_static)
                                      : fmt::format("{:>8}  ", "n/a");
    } else {
      line += fmt::format("{:>10}  {:>8}  ", "n/a", "n/a");
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const double v = parts[i](p);
      if (i == 1 && !tok) {
        line += fmt::format("{:>9}  ", "n/a");
        continue;
      }
      line += fmt::format("{}{}  ", fixed(1e3 * v, 8, 2), mark(v, best[i]));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string simulation_table(const Scenario& scenario, const SimulationResult& result) {
  std::string out = header(scenario, result);
  out += metrics_table(result);
  out +=
      "imb floor: the lowest mean imbalance any assignment reaches on the policy's layouts (above "
      "it, the assignment's)\n";
  for (const auto& p : result.policies) {
    if (!p.skipped.empty()) continue;
    out += fmt::format(
        "whole-task bound: no layout and assignment has a mean imbalance below {:.3f} (the "
        "busiest rank carries at least ceil(tasks / G) whole tasks)\n",
        std::floor(p.imbalance_bound_mean * 1000) / 1000);  // rounded down: the claim stays true
    out += fmt::format("MaxVio (a property of the routing, the same for every policy): {:.3f}\n",
                       p.maxvio_mean);
    break;
  }
  out += time_table(result);
  out +=
      "(* best in column; cross-node tokens and imbalance are exact replay metrics; times are "
      "modelled)\n";
  if (const std::string note = planning_time_note(scenario.cost);
      !note.empty() && !result.load_only)
    out += "note: " + note + "\n";
  for (const std::string& note : replica_cost_notes(scenario, result)) out += note + "\n";
  return out;
}

std::string planning_time_note(const CostParams& cost) {
  if (cost.planner_time_scale <= 0 || cost.planner_overlap >= 1) return "";
  return fmt::format(
      "planning is measured planner wall time x {}{}, so step times and speedups vary between "
      "runs (--planner-time-scale 0 leaves it out)",
      cost.planner_time_scale,
      cost.planner_overlap > 0 ? fmt::format(" x {} (1 - overlap)", 1 - cost.planner_overlap) : "");
}

// Cobalt's policies fill every replica slot; with few tokens per GPU their replicas' gradient
// synchronisation can outweigh what they save (docs/results.md).
std::vector<std::string> replica_cost_notes(const Scenario& scenario,
                                            const SimulationResult& result) {
  std::vector<std::string> notes;
  // Load-only traces have no exchange term, so no step time to compare.
  if (scenario.layout_pricing || result.load_only) return notes;
  for (const auto& p : result.policies) {
    if (!p.skipped.empty() || !p.has_token_metrics || (p.name != "cobalt" && p.name != "cobalt+")) {
      continue;
    }
    const TimeBreakdown& t = p.time;
    if (p.speedup_vs_static <= 0 || p.speedup_vs_static >= 1) continue;
    // Slower than static mainly because of the synchronisation: it makes up at least half of the
    // gap to static's step, and it is the largest overhead.
    const double gap_s = p.sim_step_time_s - p.sim_step_time_s * p.speedup_vs_static;
    if (t.grad_sync_s < 0.5 * gap_s || t.grad_sync_s < t.migration_s ||
        t.grad_sync_s < t.planning_s) {
      continue;
    }
    notes.push_back(fmt::format(
        "note: {} is modelled {:.2f}x of static EP here: its replicas' gradient synchronisation "
        "({:.2f} ms per step) outweighs what they save at this number of tokens per GPU; with "
        "--layout-pricing, cobalt+ keeps only the replicas that pay",
        p.name, p.speedup_vs_static, 1e3 * t.grad_sync_s));
  }
  return notes;
}

}  // namespace cobalt::eval
