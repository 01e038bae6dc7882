#include "policy_registry.hpp"

namespace cobalt::policy {

const std::vector<RegistryEntry>& registry() {
  static const std::vector<RegistryEntry> entries = {
      {"static", make_static_policy},       {"cobalt", make_cobalt_policy},
      {"cobalt+", make_cobalt_plus_policy}, {"smartmoe", make_smartmoe_policy},
      {"fastermoe", make_fastermoe_policy}, {"flexmoe", make_flexmoe_policy},
      {"laer", make_laer_policy},           {"topoep", make_topoep_policy},
      {"eplb", make_eplb_policy},           {"ultraep", make_ultraep_policy},
  };
  return entries;
}

}  // namespace cobalt::policy
