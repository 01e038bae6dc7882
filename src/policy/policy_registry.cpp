#include "policy_registry.hpp"

namespace cobalt::policy {

const std::vector<RegistryEntry>& registry() {
  // Memory: peak RSS over `static` at E = 4096 and 8192, G = 2048 and 4096, 1 and 4 layers
  // (scripts/measure_policy_memory.py, 2026-12-05), fitted per term and rounded up. Every policy
  // but static keeps a layout per layer (an E x G bit table and O(E N + G S) lists: 0.25 E G).
  // cobalt / cobalt+: the E x E EMA statistics, count scratch and planner state per layer (16-17
  // E^2 measured here, 18.4 at E = 1024 on 64 ranks: 19 taken), a plan snapshot in flight with
  // async planning (8 E^2), the global planner's copies (8 E^2 measured, 10 taken, + 3.5 E G).
  // smartmoe and laer keep a window of 2 and 3 int64 [G, E] demand matrices per layer; the peers
  // count each step's int64 [G, E] demand and plan from [G, E] tables (cursors, quotas) once.
  constexpr double kLayout = 0.25;
  const MemoryCoefficients cobalt_memory{.per_layer_eg = kLayout,
                                         .per_layer_ee = 19,
                                         .async_per_layer_ee = 8,
                                         .working_eg = 3.5,
                                         .working_ee = 10};
  static const std::vector<RegistryEntry> entries = {
      {"static", make_static_policy, {}},
      {"cobalt", make_cobalt_policy, cobalt_memory},
      {"cobalt+", make_cobalt_plus_policy, cobalt_memory},
      {"smartmoe", make_smartmoe_policy, {.per_layer_eg = 16 + kLayout, .working_eg = 17}},
      {"fastermoe", make_fastermoe_policy, {.per_layer_eg = kLayout, .working_eg = 9}},
      {"flexmoe", make_flexmoe_policy, {.per_layer_eg = kLayout, .working_eg = 9}},
      {"laer", make_laer_policy, {.per_layer_eg = 25, .working_eg = 19}},
      {"topoep", make_topoep_policy, {.per_layer_eg = kLayout, .working_eg = 17}},
      {"eplb", make_eplb_policy, {.per_layer_eg = kLayout}},
      {"ultraep", make_ultraep_policy, {.per_layer_eg = kLayout, .working_eg = 32}},
  };
  return entries;
}

}  // namespace cobalt::policy
