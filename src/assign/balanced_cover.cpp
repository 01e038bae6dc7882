#include "cobalt/assign/balanced_cover.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"
#include "path_spill.hpp"

namespace cobalt::assign {
namespace {

// (expert, allowed node mask) -> class id: open addressing with linear probing over a power-of-two
// table kept at most half full. Above 8 nodes an expert replicated on many nodes can see
// thousands of distinct masks in one batch (16601 for one expert of a 16-node planned layout in
// BM_Assign_BalancedCover_16Nodes), so a per-expert list scanned linearly is not enough.
class ClassIndex {
 public:
  // The id stored for (e, mask); stores `id` first when there is none.
  int32_t find_or_insert(ExpertId e, uint64_t mask, int32_t id) {
    if (2 * (used_ + 1) > slots_.size()) grow();
    const size_t bits = slots_.size() - 1;
    for (size_t i = hash(e, mask) & bits;; i = (i + 1) & bits) {
      Slot& slot = slots_[i];
      if (slot.expert == e && slot.mask == mask) return slot.id;
      if (slot.expert < 0) {
        slot = Slot{mask, e, id};
        ++used_;
        return id;
      }
    }
  }

 private:
  struct Slot {
    uint64_t mask = 0;
    ExpertId expert = -1;  // -1: empty
    int32_t id = -1;
  };
  static size_t hash(ExpertId e, uint64_t mask) {
    return static_cast<size_t>(mix64(mask ^ (static_cast<uint64_t>(e) << 40)));
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(64, 2 * old.size()), Slot{});
    used_ = 0;
    for (const Slot& slot : old) {
      if (slot.expert >= 0) find_or_insert(slot.expert, slot.mask, slot.id);
    }
  }
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

struct TaskClass {
  ExpertId expert;
  uint64_t allowed_nodes;
  int64_t count = 0;
  std::vector<RankId> ranks;                      // allowed ranks, ascending
  std::vector<std::pair<RankId, int64_t>> quota;  // (rank, tasks), ascending rank
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

BalancedCoverWorkspace::BalancedCoverWorkspace() = default;
BalancedCoverWorkspace::~BalancedCoverWorkspace() = default;
BalancedCoverWorkspace::BalancedCoverWorkspace(BalancedCoverWorkspace&&) noexcept = default;
BalancedCoverWorkspace& BalancedCoverWorkspace::operator=(BalancedCoverWorkspace&&) noexcept =
    default;

size_t BalancedCoverWorkspace::capacity_bytes() const {
  return per_token_.capacity() * sizeof(uint64_t) + per_task_.capacity() * sizeof(uint32_t) +
         (spill_ ? spill_->capacity_bytes() : 0);
}

void assign_balanced_cover(const RoutingBatch& batch, const ExpertLayout& layout,
                           const AssignOptions& options, std::span<RankId> exec_rank,
                           double spill_tolerance, BalancedCoverWorkspace* workspace) {
  check_threads(options.num_threads, "assignment");
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "assignment: output holds {} ranks, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  BalancedCoverWorkspace call_workspace;
  BalancedCoverWorkspace& scratch = workspace ? *workspace : call_workspace;
  const int num_nodes = layout.num_nodes(), per_node = layout.topology().ranks_per_node();
  const int top_k = batch.top_k();
  // Every entry of both is written before it is read (covers here, the task classes by the class
  // pass); a kept buffer of the size is not touched by the resize.
  scratch.per_token_.resize(batch.num_tokens());
  scratch.per_task_.resize(batch.num_tasks());
  const std::span<uint64_t> covers(scratch.per_token_.data(), batch.num_tokens());
  remote_node_covers(batch, layout, options, covers);

  // Classes keyed by (expert, allowed node mask). Their ids do not matter for the result: the
  // water-filling order is a total order on (flexibility, count, expert, mask), and each class's
  // tasks take its quotas in token order.
  //   N <= 8 (when the per-chunk tables fit): a task's key is (e << N) | allowed; keys are counted
  //     per token chunk in parallel, classes are the used keys in key order, and the mapping runs
  //     per chunk from each class's count in the chunks before it.
  //   Otherwise: per token chunk in parallel, classes are found in a hash index of (expert,
  //     mask) (ClassIndex); the chunks' classes are then merged in chunk order (ids in first-seen
  //     token order) and the mapping runs per chunk as above.
  const int num_threads = resolve_threads(options.num_threads);
  const int64_t num_tokens = batch.num_tokens();
  const int num_chunks =
      static_cast<int>(std::clamp<int64_t>(num_tokens / 8192, 1, 4 * num_threads));
  constexpr int kTableNodes = 8;
  constexpr size_t kMaxCountEntries = size_t{1} << 24;  // per-chunk key counts: 64 MiB of int32
  const size_t num_keys =
      num_nodes <= kTableNodes ? static_cast<size_t>(layout.num_experts()) << num_nodes : 0;
  const bool use_keys =
      num_nodes <= kTableNodes && num_keys * static_cast<size_t>(num_chunks) <= kMaxCountEntries;
  std::vector<uint64_t> node_bit_of_rank(layout.num_ranks());
  for (RankId r = 0; r < layout.num_ranks(); ++r)
    node_bit_of_rank[r] = uint64_t{1} << (r / per_node);
  const RankId* source = batch.source_rank().data();
  const auto reach_of = [&](TokenIdx t) { return covers[t] | node_bit_of_rank[source[t]]; };
  std::vector<TaskClass> classes;
  const auto new_class = [&](ExpertId e, uint64_t allowed) {
    TaskClass cls{e, allowed, 0, {}, {}};
    for (uint64_t m = allowed; m; m &= m - 1) {
      auto ranks = layout.ranks_of(e, std::countr_zero(m));
      cls.ranks.insert(cls.ranks.end(), ranks.begin(), ranks.end());
    }
    classes.push_back(std::move(cls));
    return static_cast<int32_t>(classes.size() - 1);
  };
  // [T K] key (use_keys) or chunk-local class id (lists) of each task, both >= 0.
  uint32_t* const task_class = scratch.per_task_.data();
  std::vector<int32_t> class_of_key;                 // [keys] (use_keys)
  std::vector<std::vector<int32_t>> class_of_local;  // [chunks][local ids] (lists)
  std::vector<int64_t> chunk_start;  // [chunks, classes]: tasks of a class in earlier chunks
  int mapping_chunks = 1;
  if (use_keys) {
    std::vector<int32_t> counts(num_keys * static_cast<size_t>(num_chunks), 0);
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      int32_t* local = counts.data() + static_cast<size_t>(c) * num_keys;
      for (TokenIdx t = begin; t < end; ++t) {
        const uint64_t reach = reach_of(t);
        auto row = batch.experts_of(t);
        for (int k = 0; k < top_k; ++k) {
          const uint32_t key = static_cast<uint32_t>((static_cast<uint64_t>(row[k]) << num_nodes) |
                                                     (reach & layout.node_mask(row[k])));
          task_class[t * top_k + k] = key;
          ++local[key];
        }
      }
    });
    class_of_key.assign(num_keys, -1);
    std::vector<size_t> key_of_class;
    for (size_t key = 0; key < num_keys; ++key) {
      int64_t total = 0;
      for (int c = 0; c < num_chunks; ++c) total += counts[static_cast<size_t>(c) * num_keys + key];
      if (total == 0) continue;
      class_of_key[key] = new_class(static_cast<ExpertId>(key >> num_nodes),
                                    key & ((uint64_t{1} << num_nodes) - 1));
      classes.back().count = total;
      key_of_class.push_back(key);
    }
    chunk_start.assign(static_cast<size_t>(num_chunks) * classes.size(), 0);
    for (size_t k = 0; k < classes.size(); ++k) {
      int64_t before = 0;
      for (int c = 0; c < num_chunks; ++c) {
        chunk_start[static_cast<size_t>(c) * classes.size() + k] = before;
        before += counts[static_cast<size_t>(c) * num_keys + key_of_class[k]];
      }
    }
    mapping_chunks = num_chunks;
  } else {
    // Per chunk, in parallel: the chunk's own classes (each expert's (mask, local id) list
    // scanned), their task counts, and each task's chunk-local id.
    struct ChunkClasses {
      ClassIndex index;                                // (e, mask) -> local id
      std::vector<std::pair<ExpertId, uint64_t>> key;  // [local] (e, mask)
      std::vector<int64_t> count;                      // [local] tasks
    };
    std::vector<ChunkClasses> chunk(num_chunks);
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      ChunkClasses& own = chunk[c];
      for (TokenIdx t = begin; t < end; ++t) {
        const uint64_t reach = reach_of(t);
        auto row = batch.experts_of(t);
        for (int k = 0; k < top_k; ++k) {
          const ExpertId e = row[k];
          const uint64_t allowed = reach & layout.node_mask(e);
          const auto next = static_cast<int32_t>(own.key.size());
          const int32_t local = own.index.find_or_insert(e, allowed, next);
          if (local == next) {
            own.key.emplace_back(e, allowed);
            own.count.push_back(0);
          }
          ++own.count[local];
          task_class[t * top_k + k] = static_cast<uint32_t>(local);
        }
      }
    });
    // In chunk order: local classes merged into global ones (ids in first-seen token order) and
    // each class's tasks in the chunks before each chunk (the mapping's starting positions).
    ClassIndex global_index;
    class_of_local.resize(num_chunks);
    for (int c = 0; c < num_chunks; ++c) {
      const ChunkClasses& own = chunk[c];
      class_of_local[c].resize(own.key.size());
      for (size_t local = 0; local < own.key.size(); ++local) {
        const auto [e, allowed] = own.key[local];
        const auto next = static_cast<int32_t>(classes.size());
        const int32_t class_idx = global_index.find_or_insert(e, allowed, next);
        if (class_idx == next) new_class(e, allowed);
        class_of_local[c][local] = class_idx;
      }
    }
    chunk_start.assign(static_cast<size_t>(num_chunks) * classes.size(), 0);
    for (int c = 0; c < num_chunks; ++c) {
      const ChunkClasses& own = chunk[c];
      for (size_t local = 0; local < own.key.size(); ++local) {
        const int32_t class_idx = class_of_local[c][local];
        chunk_start[static_cast<size_t>(c) * classes.size() + class_idx] = classes[class_idx].count;
        classes[class_idx].count += own.count[local];
      }
    }
    mapping_chunks = num_chunks;
  }
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
  // Tasks take their class's quotas in token order: the p-th task of a class (p counted from the
  // class's first task) runs on the rank of the quota covering position p. The quotas of every
  // class in one flat list (class k's from quota_begin[k]), with one sentinel at the end.
  std::vector<int64_t> quota_begin(classes.size() + 1, 0);
  for (size_t k = 0; k < classes.size(); ++k)
    quota_begin[k + 1] = quota_begin[k] + static_cast<int64_t>(classes[k].quota.size());
  std::vector<RankId> quota_rank(quota_begin.back() + 1, 0);
  std::vector<int64_t> quota_size(quota_begin.back() + 1, 0);
  for (size_t k = 0; k < classes.size(); ++k) {
    for (size_t q = 0; q < classes[k].quota.size(); ++q) {
      quota_rank[quota_begin[k] + q] = classes[k].quota[q].first;
      quota_size[quota_begin[k] + q] = classes[k].quota[q].second;
      // The mapping advances when a quota is used up: an empty one would be skipped wrongly
      // (water_fill emits none).
      COBALT_CHECK_INTERNAL(classes[k].quota[q].second > 0, "balanced cover: empty quota");
    }
  }
  parallel_chunks(num_tokens, mapping_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
    // Per class: the quota this chunk's next task takes, and the tasks left in it. A class's first
    // task here is at position chunk_start[c, k] of the class: skip the quotas filled before it.
    const size_t num_classes = classes.size();
    std::vector<int64_t> current(num_classes), left(num_classes);
    for (size_t k = 0; k < num_classes; ++k) {
      int64_t q = quota_begin[k], skip = chunk_start[c * num_classes + k];
      while (q < quota_begin[k + 1] && quota_size[q] <= skip) skip -= quota_size[q++];
      current[k] = q;
      // When every task of class k comes before this chunk, q is past its quotas (the next
      // class's first, or the sentinel) and is never used.
      left[k] = quota_size[q] - skip;
    }
    const uint32_t* task_class_data = task_class;
    const int32_t* class_of = use_keys ? class_of_key.data() : class_of_local[c].data();
    RankId* out = exec_rank.data();
    for (int64_t i = begin * top_k; i < end * top_k; ++i) {
      const int32_t k = class_of[task_class_data[i]];
      int64_t q = current[k];
      out[i] = quota_rank[q];
      if (--left[k] == 0) {
        current[k] = ++q;
        left[k] = quota_size[q];
      }
    }
  });
  // (A cap at or above every task, an infinite tolerance included, leaves nothing to do; a NaN
  // tolerance is not >= 0.)
  const int64_t cap = spill_tolerance >= 0
                          ? balance_cap(batch.num_tasks(), layout.num_ranks(), spill_tolerance)
                          : batch.num_tasks();
  if (cap < batch.num_tasks()) {
    // The spill's O(T K) bookkeeping reuses the covers' and the classes' buffers; the rest of
    // its bookkeeping is kept in the workspace too.
    if (!scratch.spill_) scratch.spill_ = std::make_unique<detail::SpillScratch>();
    detail::spill_along_paths(batch, layout, cap, load, exec_rank, scratch.per_token_,
                              scratch.per_task_, scratch.spill_.get(), num_threads);
  }
}

}  // namespace cobalt::assign
