// A training step's view of Cobalt, from C++: a policy (cobalt+ by default) decides the expert
// layout and, for every token-expert task, the rank that runs it; the step then measures the
// cross-node token transfers and the rank imbalance of that decision. When the layout changes, the
// step also works out what a runtime must copy: the new replicas (ExpertLayout diff) and the
// experts whose main instance, holding the parameters and optimizer state, moves.
//
//   policy_steps [POLICY] [STEPS]      e.g. policy_steps cobalt+ 12
//
// The routing comes from the library's synthetic workload generator (the `realistic` preset on
// 2 nodes x 4 GPUs); in a training stack it is the router's top-k output of each MoE layer.
// Built against an installed Cobalt (find_package(cobalt)): see CMakeLists.txt beside this file.
#include <cobalt/core/error.hpp>
#include <cobalt/core/expert_layout.hpp>
#include <cobalt/core/routing_batch.hpp>
#include <cobalt/core/topology.hpp>
#include <cobalt/eval/cost_model.hpp>
#include <cobalt/eval/metrics.hpp>
#include <cobalt/policy/policy.hpp>
#include <cobalt/workload/presets.hpp>
#include <cobalt/workload/synthetic.hpp>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) try {
  using namespace cobalt;
  const std::string policy_name = argc > 1 ? argv[1] : "cobalt+";
  const int num_steps = argc > 2 ? std::stoi(argv[2]) : 12;

  // 2 nodes x 4 GPUs; one source rank per GPU.
  const Topology topology(/*num_nodes=*/2, /*num_ranks=*/8);
  workload::PresetOverrides overrides;
  overrides.num_steps = num_steps;
  overrides.tokens_per_step = 4096;
  overrides.num_sources = topology.num_ranks();
  overrides.num_layers = 1;
  const workload::WorkloadSpec spec = workload::workload_preset("realistic", overrides);
  const io::TraceData trace = workload::generate_trace(spec);

  policy::PolicyConfig config;
  config.topology = topology;
  config.num_experts = trace.num_experts;
  config.top_k = trace.top_k;
  config.num_layers = 1;
  config.slots_per_rank = slots_for_rho(trace.num_experts, topology.num_ranks(), /*rho=*/0.5);
  const auto policy = policy::make_policy(policy_name, config);  // throws on an unknown name

  std::printf("%s on %d nodes x %d GPUs, E = %d, top-%d, %d slots per GPU\n",
              policy->name().c_str(), topology.num_nodes(), topology.ranks_per_node(),
              config.num_experts, config.top_k, config.slots_per_rank);
  std::printf("step  tokens  cross-node  imbalance\n");
  std::shared_ptr<const ExpertLayout> previous;  // the layout in force before this step
  std::vector<RankId> main_ranks;                // [E] where each expert's main instance lives
  for (int step = 0; step < num_steps; ++step) {
    const int64_t begin = trace.step_offsets[step], end = trace.step_offsets[step + 1];
    const size_t k = static_cast<size_t>(trace.top_k);
    const std::span<const ExpertId> ids(trace.topk_ids.data() + begin * k, (end - begin) * k);
    const std::span<const RankId> sources(trace.source_rank.data() + begin, end - begin);
    // Validates its input (ids in [0, E), distinct per token, sources in [0, G)).
    const RoutingBatch batch(ids, sources, trace.top_k, trace.num_experts, topology.num_ranks());

    std::vector<RankId> exec_rank(ids.size());  // [T, K]: the rank that runs each task
    const auto layout = policy->run(step, /*layer=*/0, batch, exec_rank);

    if (!previous) {
      main_ranks = eval::initial_main_ranks(*layout);
    } else if (layout !=
               previous) {  // a new layout: what the runtime copies before the experts run
      const LayoutDiff copies = diff(*previous, *layout);
      const std::vector<RankId> next_mains = eval::next_main_ranks(*layout, main_ranks);
      int moved_mains = 0;
      for (size_t e = 0; e < next_mains.size(); ++e) moved_mains += next_mains[e] != main_ranks[e];
      std::printf(
          "      layout change: %lld replica copies across nodes, %lld over NVLink, "
          "%lld dropped; %d main instances (with optimizer state) move\n",
          static_cast<long long>(copies.num_cross_node),
          static_cast<long long>(copies.num_intra_node), static_cast<long long>(copies.num_removed),
          moved_mains);
      main_ranks = next_mains;
    }
    previous = layout;

    const eval::StepMetrics m = eval::step_metrics(batch, exec_rank, layout->topology());
    std::printf("%4d  %6lld  %10lld  %9.3f\n", step, static_cast<long long>(end - begin),
                static_cast<long long>(m.transfers.dedup), m.imbalance);
  }
  std::printf("planner wall time %.1f ms, %lld global re-layouts\n",
              policy->counters().planner_wall_ms,
              static_cast<long long>(policy->counters().num_global_plans));
  return 0;
} catch (const cobalt::Error& e) {
  std::fprintf(stderr, "policy_steps: %s\n", e.what());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "policy_steps: %s\n", e.what());
  return 2;
}
