#include "cobalt/workload/synthetic.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"
#include "layer_model.hpp"
#include "local_group.hpp"

namespace cobalt::workload {

namespace {

// Tokens per work chunk: chunks only split the work; every token has its own counter-based stream.
constexpr int64_t kTokensPerChunk = 16384;

// Groups up to this size are drawn from a per-token copy of their weights (exact sampling without
// replacement in O(size) per pick); larger groups use rejection on their alias table.
constexpr int kMaxLocalGroup = 64;

// Draws the K experts of tokens [begin, end) of one (step, layer).
//   ids: [T_s, K] of this step; sources: [T_s].
void sample_tokens(const WorkloadSpec& spec, const StepSampler& sampler, int step, int layer,
                   int64_t begin, int64_t end, std::span<const RankId> sources,
                   std::span<ExpertId> ids) {
  const int top_k = spec.top_k;
  const double affinity = sampler.affinity;
  const double locality = sampler.use_domains ? sampler.locality : 0.0;
  // Per group, the total its local draws start from.
  std::vector<double> group_totals(sampler.group_members.size(), 0.0);
  for (size_t g = 0; g < group_totals.size(); ++g) {
    if (sampler.group_members[g].size() <= kMaxLocalGroup) {
      group_totals[g] = LocalGroup::total_of(sampler.group_members[g]);
    }
  }
  // counter_hash(seed, step, layer, t, 0), with the (seed, step, layer) part computed once.
  const uint64_t prefix =
      counter_prefix(spec.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(layer));
  for (int64_t t = begin; t < end; ++t) {
    SplitMix64 rng(task_hash(prefix, static_cast<uint64_t>(t), 0));
    auto next = [&rng] { return rng.next(); };
    const int domain = sampler.domain_of_source[sources[t]];
    const bool local_group = locality > 0 && uniform_unit(rng.next()) < locality;
    const int group = local_group ? sampler.domain_groups[domain].sample(rng.next())
                                  : sampler.groups.sample(rng.next());
    const AliasTable& members = sampler.group_members[group];
    const bool use_local = affinity > 0 && members.size() <= kMaxLocalGroup;
    std::optional<LocalGroup> local;
    if (use_local) local.emplace(members, group_totals[group]);
    ExpertId* row = ids.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      const std::span<const ExpertId> chosen(row, static_cast<size_t>(k));
      ExpertId e = -1;
      if (affinity > 0 && uniform_unit(rng.next()) < affinity) {
        e = use_local ? local->draw(rng.next()) : members.sample_excluding(chosen, next);
      }
      if (e < 0) {
        if (locality > 0 && uniform_unit(rng.next()) < locality) {
          e = sampler.domain_experts[domain].sample_excluding(chosen, next);
        }
        if (e < 0) e = sampler.experts.sample_excluding(chosen, next);
        // A popularity draw may take a member of the token's group: not drawable from it any more.
        if (use_local && sampler.group_of[e] == group) local->remove(sampler.slot_in_group[e]);
      }
      row[k] = e;
    }
  }
}

std::string spec_json(const WorkloadSpec& spec) {
  nlohmann::ordered_json j;
  j["name"] = spec.name;
  j["num_experts"] = spec.num_experts;
  j["top_k"] = spec.top_k;
  j["num_layers"] = spec.num_layers;
  j["num_steps"] = spec.num_steps;
  j["tokens_per_step"] = spec.tokens_per_step;
  j["num_sources"] = spec.num_sources;
  j["seed"] = spec.seed;
  j["zipf_exponent"] = spec.zipf_exponent;
  j["layer_skew_spread"] = spec.layer_skew_spread;
  j["popularity_order"] = popularity_order_name(spec.popularity_order);
  j["hot_churn"] = spec.hot_churn;
  j["hot_count"] = spec.hot_count;
  j["group_size"] = spec.group_size;
  j["group_mixing"] = spec.group_mixing;
  j["group_affinity"] = spec.group_affinity;
  j["final_group_affinity"] = spec.final_group_affinity;
  j["group_churn"] = spec.group_churn;
  j["num_domains"] = spec.num_domains;
  j["domain_locality"] = spec.domain_locality;
  return j.dump();
}

}  // namespace

io::TraceData generate_trace(const WorkloadSpec& spec, const GenerateOptions& options) {
  validate(spec);
  check_threads(options.num_threads, "workload generator");
  const int top_k = spec.top_k;
  const int64_t tokens_per_step = spec.tokens_per_step;
  const int64_t num_tokens = spec.num_tokens();

  io::TraceData data;
  data.num_experts = spec.num_experts;
  data.top_k = top_k;
  data.num_layers = spec.num_layers;
  data.num_tokens = num_tokens;
  data.num_sources = spec.num_sources;
  data.step_offsets.resize(static_cast<size_t>(spec.num_steps) + 1);
  for (int s = 0; s <= spec.num_steps; ++s) data.step_offsets[s] = s * tokens_per_step;

  // Source ranks: the same contiguous blocks in every step. [T_s] then [T].
  std::vector<RankId> step_sources(static_cast<size_t>(tokens_per_step));
  for (int64_t i = 0; i < tokens_per_step; ++i) {
    step_sources[i] = static_cast<RankId>(i * spec.num_sources / tokens_per_step);
  }
  data.source_rank.resize(static_cast<size_t>(num_tokens));
  for (int s = 0; s < spec.num_steps; ++s) {
    std::copy(step_sources.begin(), step_sources.end(),
              data.source_rank.begin() + static_cast<ptrdiff_t>(s * tokens_per_step));
  }

  data.topk_ids.resize(static_cast<size_t>(spec.num_layers) * num_tokens * top_k);
  const int num_threads = resolve_threads(options.num_threads);
  const int num_chunks =
      static_cast<int>((tokens_per_step + kTokensPerChunk - 1) / kTokensPerChunk);
  const int64_t total_units = static_cast<int64_t>(spec.num_layers) * spec.num_steps;
  int64_t done_units = 0;
  StepSampler sampler;
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    LayerModel model(spec, layer);
    for (int step = 0; step < spec.num_steps; ++step) {
      if (step > 0) model.drift_to(step);
      model.build_sampler(step, sampler);
      const std::span<ExpertId> step_ids(
          data.topk_ids.data() + (layer * num_tokens + step * tokens_per_step) * top_k,
          static_cast<size_t>(tokens_per_step * top_k));
      parallel_chunks(
          tokens_per_step, num_chunks, num_threads, [&](int, int64_t begin, int64_t end) {
            sample_tokens(spec, sampler, step, layer, begin, end, step_sources, step_ids);
          });
      ++done_units;
      if (options.progress) options.progress(done_units, total_units);
    }
  }

  data.metadata["model"] = "synthetic";
  data.metadata["dataset"] = fmt::format("synthetic workload '{}'", spec.name);
  data.metadata["origin"] = "cobalt workload generator (cobalt/workload/synthetic.hpp)";
  data.metadata["workload"] = spec.name;
  data.metadata["seed"] = std::to_string(spec.seed);
  data.metadata["workload_spec"] = spec_json(spec);
  return data;
}

}  // namespace cobalt::workload
