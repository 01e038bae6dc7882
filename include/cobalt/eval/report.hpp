// Simulation reports: the JSON of DESIGN.md §3.2 (report_json.cpp), the terminal comparison tables
// (report_table.cpp) and the self-contained HTML report with inline SVG charts (report_html.cpp).
// Times come from the cost model and every output labels them as modelled.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/eval/step_source.hpp"

namespace cobalt::eval {

// Describes what was simulated (the JSON "scenario" object and the report headers).
struct Scenario {
  std::string workload;        // trace path or preset name
  std::string cluster;         // "NxM"
  std::string cluster_preset;  // preset whose hardware numbers apply ("4x8-b200", ...)
  ModelPreset model;           // sizes used by the cost model
  std::string model_reason;    // why this model: "--model", "trace metadata", "E/K match", ...
  CostParams cost;
  ChunkInfo chunks;
  std::optional<double> holdout;  // --holdout fraction when given
  int slots_per_rank = 0;
  double rho = -1;         // when the budget was given as rho
  int replica_slots = -1;  // when given as extra slots per rank
  double eps = 0.15;
  int steps_per_global_plan = 10;
  uint64_t seed = 0;
  bool async_planning = false;
  bool layout_pricing = false;     // cobalt+ priced its layouts with the cost model
  std::vector<std::string> notes;  // anything the user should know (re-chunking, E/K mismatch)
};

// Index of the policy the reports call best: the lowest modelled step time among the policies that
// ran (lowest imbalance mean on load-only traces); -1 when none ran.
int best_policy_index(const SimulationResult& result);

// Notes on `cobalt` and `cobalt+` where the model finds them slower than static EP mainly because
// of their replicas' gradient synchronisation (at least half of the gap to static's step, and their
// largest overhead: few tokens per GPU), pointing to --layout-pricing; none when the run priced
// its layouts or the trace is load-only. One line each, no trailing newline; the
// table and the HTML report print them.
std::vector<std::string> replica_cost_notes(const Scenario& scenario,
                                            const SimulationResult& result);

// What the reports say of the planning term when it is in the modelled step time (planner
// time scale > 0 and planning not fully overlapped): it is measured planner wall time on this
// machine, so step times, speedups and the best policy vary between runs. Empty when the term is
// left out (then every time is a pure function of the replay). One line, no trailing newline.
std::string planning_time_note(const CostParams& cost);

// {"scenario": {...}, "policies": [{"name", "cross_node_tokens", ...}]}
std::string simulation_json(const Scenario& scenario, const SimulationResult& result);

// Two aligned tables (exact replay metrics, then modelled time per step), best value per column
// marked with '*'.
std::string simulation_table(const Scenario& scenario, const SimulationResult& result);

// What the HTML report shows beyond the simulation result.
struct ReportExtras {
  int layer = 0;                     // layer of the heatmap and the layout grid
  std::vector<double> expert_load;   // [E] tasks per expert over the measured steps of `layer`
  std::vector<double> coactivation;  // [E, E] tokens choosing both; empty for load-only traces
};

// Exact loads and co-activation of `layer` over steps [first_step, S) (load-only sources: loads
// only).
ReportExtras collect_report_extras(const StepSource& source, int layer, int first_step,
                                   int num_ranks);

// One self-contained HTML page (inline SVG and CSS, a tiny inline script that records on <body
// data-charts-rendered="k/n"> how many charts have a non-empty layout box; no network): Pareto
// scatter, per-step lines, Ochiai heatmap, layout grid of the best policy, time breakdown. Every
// chart is an <svg data-chart="NAME">.
std::string simulation_html(const Scenario& scenario, const SimulationResult& result,
                            const ReportExtras& extras);

}  // namespace cobalt::eval
