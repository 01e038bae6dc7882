#include "policy_registry.hpp"

namespace cobalt::policy {

const std::vector<RegistryEntry>& registry() {
  static const std::vector<RegistryEntry> entries = {
      {"static", make_static_policy},
      {"cobalt", make_cobalt_policy},
      {"cobalt+", make_cobalt_plus_policy},
  };
  return entries;
}

}  // namespace cobalt::policy
