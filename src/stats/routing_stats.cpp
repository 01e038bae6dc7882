#include "cobalt/stats/routing_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/value_checks.hpp"

namespace cobalt {

RoutingStats::RoutingStats(int num_experts, double decay, bool exact)
    : num_experts_(num_experts), decay_(decay), exact_(exact) {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= 65536,
                   "stats: number of experts {} out of range [1, 65536]", num_experts);
  COBALT_CHECK_ARG(exact || (decay >= 0.0 && decay < 1.0),
                   "stats: EMA decay {} out of range [0, 1)", decay);
  // The EMA matrix (double) and update()'s int64 count scratch.
  require_memory(16.0 * num_experts * num_experts,
                 fmt::format("routing statistics: the {} x {} co-activation matrix", num_experts,
                             num_experts));
  expert_load_.assign(num_experts, 0.0);
  coactivation_.assign(static_cast<size_t>(num_experts) * num_experts, 0.0);
}

void RoutingStats::count_into_scratch(const RoutingBatch& batch, int num_threads) {
  COBALT_CHECK_ARG(batch.num_experts() == num_experts_,
                   "stats: batch has {} experts, stats track {}", batch.num_experts(),
                   num_experts_);
  scratch_loads_.resize(num_experts_);
  scratch_coact_.resize(static_cast<size_t>(num_experts_) * num_experts_);
  count_routing(batch, scratch_loads_, scratch_coact_, num_threads);
}

void RoutingStats::update(const RoutingBatch& batch, int num_threads) {
  count_into_scratch(batch, num_threads);
  add_counts(scratch_loads_, scratch_coact_);  // count_routing's counts need no validation
}

void RoutingStats::fold_into_last_update(const RoutingBatch& batch, int num_threads) {
  count_into_scratch(batch, num_threads);
  add_counts(scratch_loads_, scratch_coact_, /*fold=*/num_updates_ > 0);
}

void RoutingStats::update_counts(std::span<const int64_t> expert_counts,
                                 std::span<const int64_t> coactivation) {
  COBALT_CHECK_ARG(
      expert_counts.size() == expert_load_.size() && coactivation.size() == coactivation_.size(),
      "stats: counts sized {} and {}, need {} and {}", expert_counts.size(), coactivation.size(),
      expert_load_.size(), coactivation_.size());
  // Counts as count_routing makes them (the planners rely on a symmetric, non-negative matrix
  // with a zero diagonal and c_ij <= min(w_i, w_j), which keeps Ochiai within [0, 1]).
  for (size_t e = 0; e < expert_counts.size(); ++e) {
    COBALT_CHECK_ARG(expert_counts[e] >= 0, "stats: expert {} has count {} (must be >= 0)", e,
                     expert_counts[e]);
  }
  // Square tiles, so that the transposed reads stay within a few cache lines per row; the first
  // bad entry in row-major order of the upper triangle is the one named.
  constexpr size_t kTile = 64;
  const size_t num_experts = expert_counts.size();
  bool bad = false;
  for (size_t i0 = 0; i0 < num_experts && !bad; i0 += kTile) {
    for (size_t j0 = i0; j0 < num_experts && !bad; j0 += kTile) {
      for (size_t i = i0; i < std::min(num_experts, i0 + kTile); ++i) {
        for (size_t j = std::max(j0, i); j < std::min(num_experts, j0 + kTile); ++j) {
          const int64_t upper = coactivation[i * num_experts + j];
          bad = bad || upper < 0 || upper != coactivation[j * num_experts + i] ||
                (i == j ? upper != 0 : upper > std::min(expert_counts[i], expert_counts[j]));
        }
      }
    }
  }
  if (bad) {  // name the first offending entry (a second, plain pass: only on the error path)
    for (size_t i = 0; i < num_experts; ++i) {
      for (size_t j = i; j < num_experts; ++j) {
        const int64_t upper = coactivation[i * num_experts + j];
        const int64_t lower = coactivation[j * num_experts + i];
        COBALT_CHECK_ARG(upper >= 0 && upper == lower,
                         "stats: co-activation counts must be symmetric and >= 0: [{}][{}] = {}, "
                         "[{}][{}] = {}",
                         i, j, upper, j, i, lower);
        COBALT_CHECK_ARG(i != j || upper == 0,
                         "stats: co-activation [{}][{}] = {} must be 0 (a token selects an expert "
                         "once)",
                         i, i, upper);
        COBALT_CHECK_ARG(i == j || upper <= std::min(expert_counts[i], expert_counts[j]),
                         "stats: co-activation [{}][{}] = {} exceeds the counts of expert {} ({}) "
                         "or {} ({}): tokens selecting both select each",
                         i, j, upper, i, expert_counts[i], j, expert_counts[j]);
      }
    }
  }
  add_counts(expert_counts, coactivation);
}

void RoutingStats::add_counts(std::span<const int64_t> expert_counts,
                              std::span<const int64_t> coactivation, bool fold) {
  // A step without tasks is no observation (an EMA started from it would begin at zero).
  if (std::all_of(expert_counts.begin(), expert_counts.end(), [](int64_t c) { return c == 0; })) {
    return;
  }
  const bool first = num_updates_ == 0;
  const double keep = fold || exact_ || first ? 1.0 : decay_;
  const double add = fold ? last_add_ : exact_ || first ? 1.0 : 1.0 - decay_;
  for (size_t e = 0; e < expert_load_.size(); ++e) {
    expert_load_[e] = keep * expert_load_[e] + add * static_cast<double>(expert_counts[e]);
  }
  for (size_t i = 0; i < coactivation_.size(); ++i) {
    coactivation_[i] = keep * coactivation_[i] + add * static_cast<double>(coactivation[i]);
  }
  if (!fold) {
    last_add_ = add;
    ++num_updates_;
  }
}

double RoutingStats::ochiai(ExpertId i, ExpertId j) const {
  const double denom = std::sqrt(expert_load_[i] * expert_load_[j]);
  return denom > 0 ? coactivation(i, j) / denom : 0.0;
}

OchiaiSummary summarize_ochiai(std::span<const double> expert_load,
                               std::span<const double> coactivation) {
  const size_t num_experts = expert_load.size();
  COBALT_CHECK_ARG(coactivation.size() == num_experts * num_experts,
                   "ochiai summary: co-activation has {} entries, need {}", coactivation.size(),
                   num_experts * num_experts);
  check_finite_non_negative(expert_load, "ochiai summary: expert load");
  check_finite_non_negative(coactivation, "ochiai summary: co-activation");
  double weighted_sum = 0, pair_sum = 0, partner_sum = 0, load_sum = 0;
  for (size_t i = 0; i < num_experts; ++i) {
    double best = 0;
    for (size_t j = 0; j < num_experts; ++j) {
      if (i == j) continue;
      const double c = coactivation[i * num_experts + j];
      const double denom = std::sqrt(expert_load[i] * expert_load[j]);
      const double o = denom > 0 ? c / denom : 0.0;
      best = std::max(best, o);
      if (j > i) {
        weighted_sum += c * o;
        pair_sum += c;
      }
    }
    partner_sum += expert_load[i] * best;
    load_sum += expert_load[i];
  }
  return {pair_sum > 0 ? weighted_sum / pair_sum : 0.0,
          load_sum > 0 ? partner_sum / load_sum : 0.0};
}

namespace {
std::vector<int> hottest(std::span<const double> load, int count) {
  std::vector<int> idx(load.size());
  std::iota(idx.begin(), idx.end(), 0);
  count = std::min<int>(count, static_cast<int>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + count, idx.end(), [&](int a, int b) {
    return load[a] > load[b] || (load[a] == load[b] && a < b);
  });
  idx.resize(count);
  std::sort(idx.begin(), idx.end());
  return idx;
}
}  // namespace

double hot_set_churn(std::span<const double> prev_load, std::span<const double> next_load,
                     int hot_count) {
  COBALT_CHECK_ARG(prev_load.size() == next_load.size(),
                   "hot-set churn: loads sized {} and {} (they must match)", prev_load.size(),
                   next_load.size());
  COBALT_CHECK_ARG(hot_count >= 1, "hot-set churn: hot count {} must be >= 1 (above E: all E)",
                   hot_count);
  check_finite_non_negative(prev_load, "hot-set churn: previous load");
  check_finite_non_negative(next_load, "hot-set churn: next load");
  const auto a = hottest(prev_load, hot_count);
  const auto b = hottest(next_load, hot_count);
  std::vector<int> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  return a.empty() ? 0.0 : 1.0 - static_cast<double>(common.size()) / static_cast<double>(a.size());
}

ReplicaLoads::ReplicaLoads(int num_ranks, int slots_per_rank, double decay)
    : num_ranks_(num_ranks), slots_per_rank_(slots_per_rank), decay_(decay) {
  COBALT_CHECK_ARG(decay >= 0 && decay < 1, "replica loads: EMA decay {} out of range [0, 1)",
                   decay);
  COBALT_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxRanks,
                   "replica loads: number of ranks {} out of range [1, {}]", num_ranks, kMaxRanks);
  COBALT_CHECK_ARG(slots_per_rank >= 1 && slots_per_rank <= kMaxExperts,
                   "replica loads: slots per rank {} out of range [1, {}]", slots_per_rank,
                   kMaxExperts);
  loads_.assign(static_cast<size_t>(num_ranks) * slots_per_rank, 0.0);
}

void ReplicaLoads::reset(std::span<const double> expected_loads) {
  COBALT_CHECK_ARG(expected_loads.size() == loads_.size(), "replica loads: got {} entries, need {}",
                   expected_loads.size(), loads_.size());
  check_finite_non_negative(expected_loads, "replica loads");
  std::copy(expected_loads.begin(), expected_loads.end(), loads_.begin());
}

void ReplicaLoads::update(std::span<const int64_t> replica_counts) {
  COBALT_CHECK_ARG(replica_counts.size() == loads_.size(), "replica loads: got {} counts, need {}",
                   replica_counts.size(), loads_.size());
  for (size_t i = 0; i < replica_counts.size(); ++i) {
    COBALT_CHECK_ARG(replica_counts[i] >= 0, "replica loads: count {} of slot {} must be >= 0",
                     replica_counts[i], i);
  }
  for (size_t i = 0; i < loads_.size(); ++i) {
    loads_[i] = decay_ * loads_[i] + (1.0 - decay_) * static_cast<double>(replica_counts[i]);
  }
}

namespace {

// The checks replica_task_counts makes, task by task in order: throws for the first bad task.
void throw_first_bad_task(std::span<const ExpertId> ids, const ExpertLayout& layout,
                          std::span<const RankId> exec_rank) {
  for (size_t i = 0; i < ids.size(); ++i) {
    COBALT_CHECK_ARG(exec_rank[i] >= 0 && exec_rank[i] < layout.num_ranks(),
                     "replica counts: task {} has execution rank {} out of range [0, {})", i,
                     exec_rank[i], layout.num_ranks());
    COBALT_CHECK_ARG(layout.holds(exec_rank[i], ids[i]),
                     "replica counts: task {} on rank {} which lacks expert {}", i, exec_rank[i],
                     ids[i]);
  }
  COBALT_CHECK_INTERNAL(false, "replica counts: a bad task was reported but none found");
}

}  // namespace

std::vector<int64_t> replica_task_counts(const RoutingBatch& batch, const ExpertLayout& layout,
                                         std::span<const RankId> exec_rank) {
  const int slots = layout.slots_per_rank(), num_ranks = layout.num_ranks();
  auto ids = batch.topk_ids();
  COBALT_CHECK_ARG(exec_rank.size() == ids.size(),
                   "replica counts: {} execution ranks for {} tasks", exec_rank.size(), ids.size());
  COBALT_CHECK_ARG(batch.num_experts() == layout.num_experts(),
                   "replica counts: the batch has E = {}, the layout E = {}", batch.num_experts(),
                   layout.num_experts());
  // One branch-free pass checks the ranks (min and max); a bad entry is named by the ordered
  // checks, run only when there is one.
  RankId low = 0, high = 0;
  for (RankId r : exec_rank) {
    low = std::min(low, r);
    high = std::max(high, r);
  }
  if (low < 0 || high >= num_ranks) throw_first_bad_task(ids, layout, exec_rank);
  // counter_of[e * G + r]: the flat counter r * S + s of expert e's slot s on rank r, or the spare
  // counter G * S where r lacks e (a task counted there is an error, reported after the pass).
  const size_t spare = static_cast<size_t>(num_ranks) * slots;
  COBALT_CHECK_INTERNAL(spare < std::numeric_limits<uint32_t>::max(),
                        "replica counts: {} slots overflow the counter index", spare);
  std::vector<uint32_t> counter_of(static_cast<size_t>(layout.num_experts()) * num_ranks,
                                   static_cast<uint32_t>(spare));
  for (RankId r = 0; r < num_ranks; ++r) {
    auto row = layout.slots_of(r);
    for (int s = 0; s < slots; ++s) {
      if (row[s] != kEmptySlot) {
        counter_of[static_cast<size_t>(row[s]) * num_ranks + r] =
            static_cast<uint32_t>(static_cast<size_t>(r) * slots + s);
      }
    }
  }
  std::vector<int64_t> counts(spare + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i)
    ++counts[counter_of[static_cast<size_t>(ids[i]) * num_ranks + exec_rank[i]]];
  if (counts[spare] > 0) throw_first_bad_task(ids, layout, exec_rank);
  counts.pop_back();
  return counts;
}

}  // namespace cobalt
