// Internal: the table of policies make_policy() knows. Each policy's .cpp defines its factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cobalt/policy/policy.hpp"

namespace cobalt::policy {

// Bytes a policy holds, as multiples of E x G (G = ranks) and E x E, fitted to peak RSS
// (docs/simulator.md "Memory" gives the command and the figures): `per_layer_*` for each MoE layer
// (statistics, windows of [G, E] demand matrices, the layer's layout), `working_*` once (the
// per-batch planners' [G, E] tables, the global planner's copies).
struct MemoryCoefficients {
  double per_layer_eg = 0, per_layer_ee = 0;
  double async_per_layer_ee = 0;  // added per layer with PolicyConfig::async_planning
  double working_eg = 0, working_ee = 0;
};

struct RegistryEntry {
  std::string name;
  std::function<std::unique_ptr<Policy>(const PolicyConfig&)> make;
  MemoryCoefficients memory;
};

const std::vector<RegistryEntry>& registry();

std::unique_ptr<Policy> make_static_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_cobalt_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_cobalt_plus_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_smartmoe_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_fastermoe_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_flexmoe_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_laer_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_topoep_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_eplb_policy(const PolicyConfig& config);
std::unique_ptr<Policy> make_ultraep_policy(const PolicyConfig& config);

}  // namespace cobalt::policy
