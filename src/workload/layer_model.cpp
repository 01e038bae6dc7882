#include "layer_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cobalt/core/rng.hpp"

namespace cobalt::workload {

namespace {

// Hash keys: per-layer set-up uses step = kSetupStep; the last key component tags the purpose, so
// no structural draw shares a key with a token draw (tag 0).
constexpr uint64_t kSetupStep = ~uint64_t{0};
constexpr uint64_t kTagLayerSkew = 1;
constexpr uint64_t kTagPopularity = 2;
constexpr uint64_t kTagGroups = 3;
constexpr uint64_t kTagHotDrift = 4;
constexpr uint64_t kTagGroupDrift = 5;

// Fisher-Yates shuffle of the identity permutation [n].
std::vector<int32_t> shuffled_identity(int n, uint64_t seed) {
  std::vector<int32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  SplitMix64 rng(seed);
  for (int i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(static_cast<uint32_t>(i + 1))]);
  return perm;
}

}  // namespace

LayerModel::LayerModel(const WorkloadSpec& spec, int layer) : spec_(spec), layer_(layer) {
  const int num_experts = spec.num_experts;
  // Latin-hypercube offsets: layer l takes stratum pi(l) of L equal strata of [-1, 1) (pi a random
  // permutation of the layers), so the layers cover the spread evenly for every seed.
  const int num_layers = spec.num_layers;
  const auto strata =
      shuffled_identity(num_layers, counter_hash(spec.seed, kSetupStep, 0, 0, kTagLayerSkew));
  const double v = uniform_unit(counter_hash(spec.seed, kSetupStep, layer, 1, kTagLayerSkew));
  const double u = 2.0 * (strata[layer] + v) / num_layers - 1.0;
  zipf_exponent_ = spec.zipf_exponent * (1.0 + spec.layer_skew_spread * u);
  profile_.resize(num_experts);
  for (int i = 0; i < num_experts; ++i)
    profile_[i] = std::pow(static_cast<double>(i + 1), -zipf_exponent_) *
                  (i < spec.hot_block_size ? spec.hot_block_weight : 1.0);

  if (spec.popularity_order == PopularityOrder::kById) {
    rank_expert_.resize(num_experts);
    std::iota(rank_expert_.begin(), rank_expert_.end(), 0);
  } else {
    rank_expert_ = shuffled_identity(num_experts,
                                     counter_hash(spec.seed, kSetupStep, layer, 0, kTagPopularity));
  }

  // Groups: experts sorted by key (1 - m) * popularity rank + m * E * u_e (u_e uniform per expert),
  // chunked into groups of group_size: m = 0 groups neighbouring popularity ranks, m = 1 is a
  // random partition.
  const double mixing = spec.group_mixing;
  std::vector<double> key(num_experts);
  for (int i = 0; i < num_experts; ++i) {
    const double u = uniform_unit(counter_hash(spec.seed, kSetupStep, layer, i, kTagGroups));
    key[rank_expert_[i]] = (1.0 - mixing) * i + mixing * num_experts * u;
  }
  std::vector<int32_t> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key[a] < key[b]; });
  group_of_.resize(num_experts);
  for (int i = 0; i < num_experts; ++i) group_of_[order[i]] = i / spec.group_size;

  // Domains: groups by decreasing popularity, each to the domain with the least popularity so far
  // (ties: lower domain id), so every domain gets a group and a similar share of the load.
  const int num_groups = spec.num_groups();
  const auto weights = expert_weights();
  std::vector<double> group_weight(num_groups, 0.0);
  for (int e = 0; e < num_experts; ++e) group_weight[group_of_[e]] += weights[e];
  std::vector<int32_t> by_weight(num_groups);
  std::iota(by_weight.begin(), by_weight.end(), 0);
  std::stable_sort(by_weight.begin(), by_weight.end(),
                   [&](int32_t a, int32_t b) { return group_weight[a] > group_weight[b]; });
  std::vector<double> domain_weight(spec.num_domains, 0.0);
  domain_of_group_.assign(num_groups, 0);
  for (int32_t g : by_weight) {
    const auto lightest = std::min_element(domain_weight.begin(), domain_weight.end());
    domain_of_group_[g] = static_cast<int32_t>(lightest - domain_weight.begin());
    *lightest += group_weight[g];
  }
}

std::vector<double> LayerModel::expert_weights() const {
  std::vector<double> weights(spec_.num_experts);
  for (int i = 0; i < spec_.num_experts; ++i) weights[rank_expert_[i]] = profile_[i];
  return weights;
}

void LayerModel::drift_to(int step) {
  const int num_experts = spec_.num_experts;
  const int hot = spec_.hot_count;
  const int warm = std::min(2 * hot, num_experts - hot);
  if (spec_.hot_churn > 0 && warm > 0) {
    // Stratified swap count: floor(s H c + phi) - floor((s-1) H c + phi) swaps at step s, so the
    // mean over steps is exactly H c with little variance (phi uniform per layer).
    const double rate = spec_.hot_count * spec_.hot_churn;
    const double phase =
        uniform_unit(counter_hash(spec_.seed, kSetupStep, layer_, 1, kTagHotDrift));
    const int num_swaps = std::min(
        {static_cast<int>(std::floor(step * rate + phase) - std::floor((step - 1) * rate + phase)),
         hot, warm});
    // Distinct hot ranks, drawn with weight i + 1 (the boundary of the hot set churns most, the
    // hottest experts persist, as in TopoEP's profiles), and distinct warm ranks drawn uniformly,
    // so no swap undoes another.
    SplitMix64 rng(counter_hash(spec_.seed, step, layer_, 0, kTagHotDrift));
    std::vector<int> hot_ranks(hot), warm_ranks(warm);
    std::iota(hot_ranks.begin(), hot_ranks.end(), 0);
    std::iota(warm_ranks.begin(), warm_ranks.end(), hot);
    double hot_weight_left = 0.5 * hot * (hot + 1);
    for (int n = 0; n < num_swaps; ++n) {
      double target = rng.unit() * hot_weight_left;
      int pick = n;
      while (pick + 1 < hot && target >= hot_ranks[pick] + 1) target -= hot_ranks[pick++] + 1;
      std::swap(hot_ranks[n], hot_ranks[pick]);
      hot_weight_left -= hot_ranks[n] + 1;
      std::swap(warm_ranks[n], warm_ranks[n + rng.below(static_cast<uint32_t>(warm - n))]);
      // The two experts trade their whole role: popularity rank and co-activation group (so group
      // and domain weights are unchanged and the hot set churns even under strong co-activation).
      ExpertId& a = rank_expert_[hot_ranks[n]];
      ExpertId& b = rank_expert_[warm_ranks[n]];
      std::swap(group_of_[a], group_of_[b]);
      std::swap(a, b);
    }
  }
  if (spec_.group_churn > 0) {
    for (int e = 0; e < num_experts; ++e) {
      const uint64_t h = counter_hash(spec_.seed, step, layer_, e, kTagGroupDrift);
      if (uniform_unit(h) < 0.5 * spec_.group_churn) {
        const int f = static_cast<int>(uniform_below(mix64(h), static_cast<uint32_t>(num_experts)));
        std::swap(group_of_[e], group_of_[f]);
      }
    }
  }
}

void LayerModel::build_sampler(int step, StepSampler& out) const {
  const int num_experts = spec_.num_experts;
  const int num_groups = spec_.num_groups();
  const int num_domains = spec_.num_domains;
  const auto weights = expert_weights();
  std::vector<ExpertId> all(num_experts);
  std::iota(all.begin(), all.end(), 0);

  out.affinity = spec_.affinity_at(step);
  out.locality = spec_.domain_locality;
  out.use_domains = num_domains > 1 && spec_.domain_locality > 0;
  out.experts.build(all, weights);

  // Members of each group in id order, and group weights.
  std::vector<std::vector<ExpertId>> members(num_groups);
  std::vector<std::vector<double>> member_weights(num_groups);
  out.group_of = group_of_;
  out.slot_in_group.resize(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    out.slot_in_group[e] = static_cast<int32_t>(members[group_of_[e]].size());
    members[group_of_[e]].push_back(e);
    member_weights[group_of_[e]].push_back(weights[e]);
  }
  std::vector<ExpertId> group_ids(num_groups);
  std::iota(group_ids.begin(), group_ids.end(), 0);
  std::vector<double> group_weight(num_groups, 0.0);
  out.group_members.resize(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    for (double w : member_weights[g]) group_weight[g] += w;
    out.group_members[g].build(members[g], member_weights[g]);
  }
  out.groups.build(group_ids, group_weight);

  out.domain_of_source.resize(spec_.num_sources);
  for (int r = 0; r < spec_.num_sources; ++r) {
    out.domain_of_source[r] =
        static_cast<int32_t>(static_cast<int64_t>(r) * num_domains / spec_.num_sources);
  }
  if (!out.use_domains) {
    out.domain_experts.clear();
    out.domain_groups.clear();
    return;
  }
  std::vector<std::vector<ExpertId>> domain_items(num_domains), domain_group_items(num_domains);
  std::vector<std::vector<double>> domain_item_weights(num_domains),
      domain_group_weights(num_domains);
  for (int e = 0; e < num_experts; ++e) {
    const int d = domain_of_group_[group_of_[e]];
    domain_items[d].push_back(e);
    domain_item_weights[d].push_back(weights[e]);
  }
  for (int g = 0; g < num_groups; ++g) {
    const int d = domain_of_group_[g];
    domain_group_items[d].push_back(g);
    domain_group_weights[d].push_back(group_weight[g]);
  }
  out.domain_experts.resize(num_domains);
  out.domain_groups.resize(num_domains);
  for (int d = 0; d < num_domains; ++d) {
    out.domain_experts[d].build(domain_items[d], domain_item_weights[d]);
    out.domain_groups[d].build(domain_group_items[d], domain_group_weights[d]);
  }
}

}  // namespace cobalt::workload
