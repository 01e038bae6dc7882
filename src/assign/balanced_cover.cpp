#include "cobalt/assign/balanced_cover.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "path_spill.hpp"

namespace cobalt::assign {
namespace {

struct TaskClass {
  ExpertId expert;
  uint64_t allowed_nodes;
  int64_t count = 0;
  std::vector<RankId> ranks;                      // allowed ranks, ascending
  std::vector<std::pair<RankId, int64_t>> quota;  // (rank, tasks), ascending rank
  size_t next = 0;                                // mapping cursor into quota
};

// Integer water-filling of `count` tasks onto `ranks` given current loads: repeatedly raise the
// least loaded ranks to the next level. Writes quotas and updates loads.
void water_fill(TaskClass& cls, std::vector<int64_t>& load) {
  std::vector<RankId> order = cls.ranks;
  std::sort(order.begin(), order.end(),
            [&](RankId a, RankId b) { return load[a] < load[b] || (load[a] == load[b] && a < b); });
  const size_t num_ranks = order.size();
  std::vector<int64_t> give(num_ranks, 0);
  int64_t remaining = cls.count;
  size_t level_count = 1;  // order[0 .. level_count) share the current level
  int64_t level = load[order[0]];
  while (remaining > 0) {
    while (level_count < num_ranks && load[order[level_count]] + give[level_count] <= level) {
      ++level_count;
    }
    const int64_t next_level =
        level_count < num_ranks
            ? load[order[level_count]]
            : level + (remaining + level_count - 1) / static_cast<int64_t>(level_count);
    const int64_t room = (next_level - level) * static_cast<int64_t>(level_count);
    if (room >= remaining || level_count == num_ranks) {
      // Spread what is left evenly over the current group; the remainder goes to the first ones.
      const int64_t each = remaining / static_cast<int64_t>(level_count);
      int64_t extra = remaining % static_cast<int64_t>(level_count);
      for (size_t i = 0; i < level_count; ++i) give[i] += each + (extra-- > 0 ? 1 : 0);
      remaining = 0;
    } else {
      for (size_t i = 0; i < level_count; ++i) give[i] += next_level - level;
      remaining -= room;
      level = next_level;
    }
  }
  for (size_t i = 0; i < num_ranks; ++i) {
    if (give[i] == 0) continue;
    load[order[i]] += give[i];
    cls.quota.emplace_back(order[i], give[i]);
  }
  std::sort(cls.quota.begin(), cls.quota.end());
}

}  // namespace

void assign_balanced_cover(const RoutingBatch& batch, const ExpertLayout& layout,
                           const AssignOptions& options, std::span<RankId> exec_rank,
                           double spill_tolerance) {
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "assignment: output holds {} ranks, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  const int num_nodes = layout.num_nodes(), per_node = layout.topology().ranks_per_node();
  const int top_k = batch.top_k();
  std::vector<uint64_t> covers(batch.num_tokens());
  remote_node_covers(batch, layout, options, covers);

  // Classes keyed by (expert, allowed node mask); ids in first-seen token order. With N <= 8 a
  // direct [E, 2^N] table finds a task's class; above, each expert's (mask, class id) list is
  // scanned (experts see few distinct masks, so a linear scan beats hashing).
  constexpr int kTableNodes = 8;
  const bool use_table = num_nodes <= kTableNodes;
  std::vector<int32_t> class_table(
      use_table ? static_cast<size_t>(layout.num_experts()) << num_nodes : 0, -1);
  std::vector<std::vector<std::pair<uint64_t, int32_t>>> classes_of_expert(
      use_table ? 0 : layout.num_experts());
  std::vector<TaskClass> classes;
  std::vector<int64_t> class_count;  // tasks per class (kept apart from the classes: hot)
  std::vector<int32_t> task_class(batch.num_tasks());
  const auto new_class = [&](ExpertId e, uint64_t allowed) {
    TaskClass cls{e, allowed, 0, {}, {}, 0};
    for (uint64_t m = allowed; m; m &= m - 1) {
      auto ranks = layout.ranks_of(e, std::countr_zero(m));
      cls.ranks.insert(cls.ranks.end(), ranks.begin(), ranks.end());
    }
    classes.push_back(std::move(cls));
    class_count.push_back(0);
    return static_cast<int32_t>(classes.size() - 1);
  };
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const uint64_t reach = covers[t] | (uint64_t{1} << (batch.source_of(t) / per_node));
    auto row = batch.experts_of(t);
    for (int k = 0; k < top_k; ++k) {
      const ExpertId e = row[k];
      const uint64_t allowed = reach & layout.node_mask(e);
      int32_t class_idx = -1;
      if (use_table) {
        int32_t& slot = class_table[(static_cast<size_t>(e) << num_nodes) | allowed];
        if (slot < 0) slot = new_class(e, allowed);
        class_idx = slot;
      } else {
        auto& known = classes_of_expert[e];
        for (const auto& [mask, idx] : known) {
          if (mask == allowed) {
            class_idx = idx;
            break;
          }
        }
        if (class_idx < 0) {
          class_idx = new_class(e, allowed);
          known.emplace_back(allowed, class_idx);
        }
      }
      ++class_count[class_idx];
      task_class[t * top_k + k] = class_idx;
    }
  }
  for (size_t c = 0; c < classes.size(); ++c) classes[c].count = class_count[c];
  // Least flexible classes first.
  std::vector<int32_t> order(classes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto &x = classes[a], &y = classes[b];
    if (x.ranks.size() != y.ranks.size()) return x.ranks.size() < y.ranks.size();
    if (x.count != y.count) return x.count > y.count;
    if (x.expert != y.expert) return x.expert < y.expert;
    return x.allowed_nodes < y.allowed_nodes;
  });
  std::vector<int64_t> load(layout.num_ranks(), 0);
  for (int32_t c : order) water_fill(classes[c], load);
  // Tasks take quotas in token order.
  for (size_t i = 0; i < task_class.size(); ++i) {
    TaskClass& cls = classes[task_class[i]];
    while (cls.quota[cls.next].second == 0) ++cls.next;
    exec_rank[i] = cls.quota[cls.next].first;
    --cls.quota[cls.next].second;
  }
  const double cap = std::ceil((1.0 + spill_tolerance) * static_cast<double>(batch.num_tasks()) /
                               layout.num_ranks());
  // (A cap at or above every task, an infinite or NaN tolerance included, leaves nothing to do.)
  if (spill_tolerance >= 0 && cap < static_cast<double>(batch.num_tasks())) {
    // The spill's own bookkeeping is O(T K): free the classes' first.
    std::vector<int32_t>().swap(task_class);
    std::vector<uint64_t>().swap(covers);
    detail::spill_along_paths(batch, layout, static_cast<int64_t>(cap), load, exec_rank);
  }
}

}  // namespace cobalt::assign
