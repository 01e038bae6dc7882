// Internal: the table of policies make_policy() knows. Each policy's .cpp defines its factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cobalt/policy/policy.hpp"

namespace cobalt::policy {

struct RegistryEntry {
  std::string name;
  std::function<std::unique_ptr<Policy>(const PolicyConfig&)> make;
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
