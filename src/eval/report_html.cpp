// simulate --report FILE.html: one self-contained page (inline CSS and SVG, no network).
#include <fmt/format.h>

#include <cmath>

#include "cobalt/eval/report.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "report_charts.hpp"
#include "svg.hpp"

namespace cobalt::eval {
namespace {

constexpr const char* kStyle = R"(
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px 32px;
       color: #222; max-width: 1240px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.modelled { background: #fff4e5; border-left: 4px solid #f28e2b; padding: 6px 10px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e3e3e3; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: bold; color: #1a5e20; }
svg { display: block; margin: 6px 0 14px 0; font-size: 11px; }
svg .title { font-size: 12px; font-weight: 600; } svg .label { font-size: 12px; }
svg .note { fill: #666; font-style: italic; } svg .cell { font-size: 9px; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; }
)";

// Renders at the end of <body>: counts the charts whose layout box is non-empty.
constexpr const char* kCheckScript = R"(<script>
(function () {
  var charts = document.querySelectorAll('svg[data-chart]'), ok = 0;
  for (var i = 0; i < charts.length; i++) {
    var box = charts[i].getBBox();
    if (box.width > 0 && box.height > 0 && charts[i].childElementCount > 1) ok++;
  }
  document.body.setAttribute('data-charts-rendered', ok + '/' + charts.length);
})();
</script>)";

std::string cell(const std::string& text, bool best = false) {
  return fmt::format("<td{}>{}</td>", best ? " class=\"best\"" : "", svg::esc(text));
}

std::string comparison_table(const SimulationResult& r, int best_idx) {
  auto best_of = [&](auto get) {
    double best = 1e300;
    for (const auto& p : r.policies) {
      if (p.skipped.empty()) best = std::min(best, static_cast<double>(get(p)));
    }
    return best;
  };
  const double bv = best_of([](const PolicyResult& p) { return p.cross_node_tokens; });
  const double bi = best_of([](const PolicyResult& p) { return p.imbalance_mean; });
  const double bx = best_of([](const PolicyResult& p) { return p.imbalance_max; });
  const double bt = best_of([](const PolicyResult& p) { return p.sim_step_time_s; });
  const bool tok = !r.load_only;
  std::string out =
      "<table><tr><th>policy</th><th>cross-node tokens</th><th>vs static</th>"
      "<th>cross-node GB</th><th>imbalance mean</th><th>imbalance max</th>"
      "<th title=\"the lowest mean imbalance any assignment reaches on the policy's layouts\">"
      "layout's imbalance floor</th>"
      "<th>modelled step ms</th><th>speedup vs static</th><th>migration GB</th>"
      "<th>planner ms (wall)</th></tr>";
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const auto& p = r.policies[i];
    out += "<tr>" + cell(p.name + (static_cast<int>(i) == best_idx ? " (best)" : ""));
    if (!p.skipped.empty()) {
      out += fmt::format("<td colspan=\"10\" style=\"text-align:left\">skipped: {}</td></tr>",
                         svg::esc(p.skipped));
      continue;
    }
    out += tok ? cell(std::to_string(p.cross_node_tokens), p.cross_node_tokens == bv) : cell("n/a");
    out += tok && p.has_reduction_vs_static
               ? cell(fmt::format("{:.1f}%", 100 * p.cross_node_reduction_vs_static))
               : cell("n/a");
    out += tok ? cell(fmt::format("{:.2f}", p.cross_node_bytes / 1e9)) : cell("n/a");
    out += cell(fmt::format("{:.3f}", p.imbalance_mean), p.imbalance_mean == bi);
    out += cell(fmt::format("{:.3f}", p.imbalance_max), p.imbalance_max == bx);
    out += cell(fmt::format("{:.3f}", p.imbalance_floor_mean));
    out += tok ? cell(fmt::format("{:.3f}", 1e3 * p.sim_step_time_s), p.sim_step_time_s == bt)
               : cell("n/a");
    out += tok && p.speedup_vs_static > 0 ? cell(fmt::format("{:.2f}x", p.speedup_vs_static))
                                          : cell("n/a");
    out += cell(fmt::format("{:.2f}", p.migration_bytes / 1e9));
    out += cell(fmt::format("{:.1f}", p.planner_wall_ms)) + "</tr>";
  }
  out += "</table>";
  for (const auto& p : r.policies) {
    if (!p.skipped.empty()) continue;
    out += fmt::format(
        "<p>Whole-task bound: no layout and assignment has a mean imbalance below {:.3f} (the "
        "busiest rank carries at least ceil(tasks / G) whole tasks).</p>",
        std::floor(p.imbalance_bound_mean * 1000) / 1000);  // rounded down: the claim stays true
    break;
  }
  return out;
}

std::string cost_table(const Scenario& sc) {
  const CostParams& c = sc.cost;
  const std::pair<const char*, std::string> rows[] = {
      {"NVLink bandwidth per GPU (one way)",
       fmt::format("{:.0f} GB/s", c.nvlink_bytes_per_s / 1e9)},
      {"inter-node bandwidth per node",
       fmt::format("{:.0f} GB/s", c.ib_bytes_per_s_per_node / 1e9)},
      {"achievable FLOP/s per GPU", fmt::format("{:.0f} TFLOP/s", c.achievable_flops / 1e12)},
      {"token bytes (hidden x bytes/element)", fmt::format("{:.0f}", c.token_bytes())},
      {"FLOPs per task (3 matmuls x 2 x hidden x FFN x 3 fwd+bwd)",
       fmt::format("{:.3g}", c.flops_per_task())},
      {"expert parameter bytes", fmt::format("{:.3g}", c.expert_param_bytes())},
      {"exchanges per layer", std::to_string(c.exchanges_per_layer)},
      {"compute/exchange overlap fraction", fmt::format("{}", c.overlap_fraction)},
      {"optimizer state factor (x parameter bytes)", fmt::format("{}", c.optimizer_factor)},
      {"gradient bytes per parameter", fmt::format("{}", c.grad_bytes_per_element)},
      {"planner overlap", fmt::format("{}", c.planner_overlap)}};
  std::string out = "<table>";
  for (const auto& [k, v] : rows) out += "<tr>" + cell(k) + cell(v) + "</tr>";
  return out + "</table>";
}

}  // namespace

ReportExtras collect_report_extras(const StepSource& source, int layer, int first_step,
                                   int num_ranks) {
  ReportExtras x;
  x.layer = layer;
  const int num_experts = source.num_experts();
  StepScratch scratch;
  if (!source.has_tokens()) {
    x.expert_load.assign(num_experts, 0.0);
    std::vector<int64_t> counts(static_cast<size_t>(num_ranks) * num_experts);
    for (int s = first_step; s < source.num_steps(); ++s) {
      source.loads(s, layer, num_ranks, counts, scratch);
      for (size_t i = 0; i < counts.size(); ++i) x.expert_load[i % num_experts] += counts[i];
    }
    return x;
  }
  RoutingStats stats = RoutingStats::exact_counts(num_experts);
  for (int s = first_step; s < source.num_steps(); ++s) {
    stats.update(source.batch(s, layer, num_ranks, scratch));
  }
  x.expert_load.assign(stats.expert_load().begin(), stats.expert_load().end());
  x.coactivation.assign(stats.coactivation().begin(), stats.coactivation().end());
  return x;
}

std::string simulation_html(const Scenario& sc, const SimulationResult& r,
                            const ReportExtras& extras) {
  const int best = best_policy_index(r);
  const ExpertLayout* best_layout = nullptr;
  if (best >= 0 && extras.layer < static_cast<int>(r.policies[best].final_layouts.size())) {
    best_layout = r.policies[best].final_layouts[extras.layer].get();
  }
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  out += fmt::format("<title>Cobalt simulation: {}</title><style>{}</style></head><body>\n",
                     svg::esc(sc.workload), kStyle);
  out += fmt::format("<h1>Cobalt simulation: {}</h1>\n", svg::esc(sc.workload));
  out += fmt::format(
      "<p>cluster {} ({}), model {} ({}), E={} K={} L={}, {} steps, {}, measured steps "
      "[{}, {}), {} slots per rank, eps {}, global plan every {} steps{}.</p>\n",
      svg::esc(sc.cluster), svg::esc(sc.cluster_preset), svg::esc(sc.model.name),
      svg::esc(sc.model_reason), r.num_experts, r.top_k, r.num_layers, r.num_steps,
      r.load_only ? std::string("load-only counts") : fmt::format("{} tokens", r.num_tokens),
      r.first_measured_step, r.num_steps, sc.slots_per_rank, sc.eps, sc.steps_per_global_plan,
      sc.async_planning ? ", asynchronous planning" : "");
  for (const auto& note : sc.notes) out += fmt::format("<p>Note: {}</p>\n", svg::esc(note));
  out +=
      "<p class=\"modelled\">Cross-node transfers and imbalance are exact replay metrics. All "
      "times are <b>modelled</b> by the cost model (DESIGN.md §5: max-rank compute, 4 exchanges "
      "bounded by the busiest IB node or NVLink rank, replica gradient sync, layout migration, "
      "planner time on the critical path), not measured; they cover the replayed MoE layers "
      "only.</p>\n";
  if (const std::string note = planning_time_note(sc.cost); !note.empty() && !r.load_only)
    out += "<p class=\"modelled\">Note: " + svg::esc(note) + ".</p>\n";
  out += "<h2>Comparison</h2>\n" + comparison_table(r, best) + "\n";
  for (const std::string& note : replica_cost_notes(sc, r)) {
    out += "<p class=\"modelled\">" + svg::esc(note) + "</p>\n";
  }
  out += "<h2>Cross-node transfers vs imbalance (Pareto picture)</h2>\n" + charts::pareto(r);
  out += "\n<h2>Per step</h2>\n";
  out += charts::per_step(r, charts::StepMetric::kCrossNodeTokens);
  out += charts::per_step(r, charts::StepMetric::kImbalance);
  out += charts::per_step(r, charts::StepMetric::kStepTime);
  out += "\n<h2>Modelled time breakdown per step</h2>\n" + charts::time_breakdown(r);
  out += "\n<h2>Co-activation (Ochiai)</h2>\n" + charts::ochiai_heatmap(extras, best_layout);
  out += "\n<h2>Expert layout of the best policy</h2>\n";
  out += best_layout ? charts::layout_grid(*best_layout, extras, r.policies[best].name)
                     : std::string("<p>no policy ran</p>");
  out += "\n<h2>Cost model parameters</h2>\n" + cost_table(sc) + "\n";
  out += kCheckScript;
  out += "\n</body></html>\n";
  return out;
}

}  // namespace cobalt::eval
