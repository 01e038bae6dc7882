#include "cobalt/plan/laer_planner.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/replica_counts.hpp"
#include "cobalt/plan/replica_routing.hpp"

namespace cobalt::plan {
namespace {

// LAER's generate_perturbed_replicas: move one increment (N when both counts are multiples of N,
// else 1) from a random expert to another; keep distinct results.
std::vector<std::vector<int>> perturbations(const std::vector<int>& base, int num_nodes,
                                            int max_per_expert, int count, uint64_t seed) {
  std::vector<std::vector<int>> out;
  const int num_experts = static_cast<int>(base.size());
  if (num_experts < 2) return out;
  std::set<std::vector<int>> seen{base};
  SplitMix64 rng(seed);
  for (int iter = 0; iter < count && static_cast<int>(seen.size()) < count + 1; ++iter) {
    const int from = static_cast<int>(rng.below(num_experts));
    int to = static_cast<int>(rng.below(num_experts - 1));
    if (to >= from) ++to;
    const int step = base[from] % num_nodes == 0 && base[to] % num_nodes == 0 ? num_nodes : 1;
    if (base[from] - step <= 0 || base[to] + step > max_per_expert) continue;
    auto next = base;
    next[from] -= step;
    next[to] += step;
    if (seen.insert(next).second) out.push_back(std::move(next));
  }
  return out;
}

}  // namespace

ExpertLayout laer_spread_placement(const Topology& topology, int num_experts, int slots_per_rank,
                                   std::span<const int> replica_counts,
                                   std::span<const double> expert_load) {
  const int num_ranks = topology.num_ranks(), num_nodes = topology.num_nodes();
  COBALT_CHECK_ARG(static_cast<int>(replica_counts.size()) == num_experts &&
                       static_cast<int>(expert_load.size()) == num_experts,
                   "laer placement: {} counts and {} loads for E = {}", replica_counts.size(),
                   expert_load.size(), num_experts);
  int64_t total = 0;
  for (int c : replica_counts) {
    COBALT_CHECK_ARG(c >= 1, "laer placement: every expert needs >= 1 replica (got {})", c);
    total += c;
  }
  COBALT_CHECK_ARG(total <= static_cast<int64_t>(num_ranks) * slots_per_rank,
                   "laer placement: {} replicas exceed {} ranks x {} slots", total, num_ranks,
                   slots_per_rank);
  struct Item {
    ExpertId expert;
    double load;
  };
  std::vector<Item> items;
  items.reserve(total);
  for (ExpertId e = 0; e < num_experts; ++e) {
    for (int i = 0; i < replica_counts[e]; ++i)
      items.push_back({e, expert_load[e] / replica_counts[e]});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.load > b.load; });

  std::vector<std::vector<ExpertId>> lists(num_ranks);
  std::vector<double> rank_load(num_ranks, 0.0);
  std::vector<uint8_t> holds(static_cast<size_t>(num_experts) * num_ranks, 0);
  std::vector<int> node_count(static_cast<size_t>(num_experts) * num_nodes, 0);
  for (const Item& item : items) {
    const ExpertId e = item.expert;
    const int* counts = node_count.data() + static_cast<size_t>(e) * num_nodes;
    const int min_count = *std::min_element(counts, counts + num_nodes);
    RankId spread = -1, any = -1;
    for (RankId r = 0; r < num_ranks; ++r) {
      if (static_cast<int>(lists[r].size()) >= slots_per_rank ||
          holds[static_cast<size_t>(e) * num_ranks + r]) {
        continue;
      }
      if (any < 0 || rank_load[r] < rank_load[any]) any = r;
      if (counts[topology.node_of(r)] == min_count &&
          (spread < 0 || rank_load[r] < rank_load[spread])) {
        spread = r;
      }
    }
    const RankId target = spread >= 0 ? spread : any;
    if (target < 0) continue;  // every rank with room already holds e: drop this replica
    lists[target].push_back(e);
    rank_load[target] += item.load;
    holds[static_cast<size_t>(e) * num_ranks + target] = 1;
    ++node_count[static_cast<size_t>(e) * num_nodes + topology.node_of(target)];
  }
  return ExpertLayout::from_rank_lists(topology, num_experts, slots_per_rank, lists);
}

double laer_modelled_time(const ExpertLayout& layout, std::span<const double> demand,
                          const LaerOptions& options) {
  const int num_ranks = layout.num_ranks();
  const Topology& topo = layout.topology();
  const auto flows = expected_flows(demand, layout, ReplicaScope::kSameNodeFirst);
  const double per_token = options.cost.compute_s_per_token();
  double comm_total = 0;
  std::vector<double> comp(num_ranks, 0.0);
  for (RankId src = 0; src < num_ranks; ++src) {
    for (RankId dst = 0; dst < num_ranks; ++dst) {
      const double f = flows[static_cast<size_t>(src) * num_ranks + dst];
      if (f == 0) continue;
      comp[dst] += f * per_token;
      if (src == dst) continue;  // LAER's self bandwidth (1e9 GB/s) makes this ~0
      const double bw = topo.node_of(src) == topo.node_of(dst) ? options.cost.nvlink_bytes_per_s
                                                               : options.cost.net_bytes_per_s;
      comm_total += f * options.cost.token_bytes / bw;
    }
  }
  const double compute_passes = options.global_checkpoint ? 4.0 : 3.0;
  return 4.0 * comm_total + compute_passes * *std::max_element(comp.begin(), comp.end());
}

LaerPlan plan_laer(const Topology& topology, int num_experts, int slots_per_rank,
                   std::span<const double> demand, const LaerOptions& options) {
  const int num_ranks = topology.num_ranks();
  COBALT_CHECK_ARG(
      static_cast<int64_t>(demand.size()) == static_cast<int64_t>(num_ranks) * num_experts,
      "laer: demand has {} entries, expected G x E = {} x {}", demand.size(), num_ranks,
      num_experts);
  const auto load = expert_loads_of(demand, num_experts);
  const int total = num_ranks * slots_per_rank;
  std::vector<std::vector<int>> candidates;
  const bool uniform = total % num_experts == 0 && total / num_experts <= num_ranks;
  if (uniform) candidates.emplace_back(num_experts, total / num_experts);
  const auto precise = proportional_replica_counts(load, total, topology.num_nodes(), num_ranks);
  candidates.push_back(precise);
  for (auto& p : perturbations(precise, topology.num_nodes(), num_ranks, options.num_perturbations,
                               options.seed)) {
    candidates.push_back(std::move(p));
  }
  if (uniform) {
    for (auto& p : perturbations(candidates.front(), topology.num_nodes(), num_ranks,
                                 options.num_perturbations, options.seed + 1)) {
      candidates.push_back(std::move(p));
    }
  }
  std::optional<LaerPlan> best;
  for (const auto& counts : candidates) {
    ExpertLayout layout =
        laer_spread_placement(topology, num_experts, slots_per_rank, counts, load);
    const double time = laer_modelled_time(layout, demand, options);
    if (!best || time < best->modelled_time_s) {
      best = LaerPlan{std::move(layout), counts, time, 0};
    }
  }
  best->num_candidates = static_cast<int>(candidates.size());
  return std::move(*best);
}

}  // namespace cobalt::plan
