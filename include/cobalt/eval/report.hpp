// Simulation reports: the JSON of DESIGN.md §3.2 and the terminal comparison table.
#pragma once

#include <string>

#include "cobalt/eval/simulator.hpp"

namespace cobalt::eval {

// Describes what was simulated (goes to the JSON "scenario" object and the table header).
struct Scenario {
  std::string workload;  // trace path or preset name
  std::string cluster;   // "NxM"
  int slots_per_rank = 0;
  double rho = -1;         // when the budget was given as rho
  int replica_slots = -1;  // when given as extra slots per rank
  double eps = 0.15;
  int steps_per_global_plan = 10;
  uint64_t seed = 0;
};

// {"scenario": {...}, "policies": [{"name", "cross_node_tokens", ...}]}
std::string simulation_json(const Scenario& scenario, const SimulationResult& result);

// Aligned table, best value per column marked with '*'.
std::string simulation_table(const Scenario& scenario, const SimulationResult& result);

}  // namespace cobalt::eval
