// Internal: the SVG charts of the HTML report (report_html.cpp assembles the page). Each returns
// one <svg data-chart="NAME"> element.
#pragma once

#include <string>

#include "cobalt/eval/report.hpp"

namespace cobalt::eval::charts {

// Cross-node tokens (x) vs imbalance mean (y) per policy, with the Pareto front (lower-left is
// better) as a dashed staircase.
std::string pareto(const SimulationResult& result);

enum class StepMetric { kCrossNodeTokens, kImbalance, kStepTime };
// One line per policy over the steps; the warm-up steps are shaded.
std::string per_step(const SimulationResult& result, StepMetric metric);

// Ochiai(i, j) of extras.layer, experts grouped by their node under `layout`, node boundaries
// drawn; experts are averaged in blocks when E > 128.
std::string ochiai_heatmap(const ReportExtras& extras, const ExpertLayout* layout);

// Nodes x ranks x slots of `layout`: expert id per slot, shaded by the expert's load, replicated
// experts outlined.
std::string layout_grid(const ExpertLayout& layout, const ReportExtras& extras,
                        const std::string& policy);

// Stacked bars of the modelled time per step (compute / exchange / grad sync / migration /
// planning) per policy.
std::string time_breakdown(const SimulationResult& result);

}  // namespace cobalt::eval::charts
