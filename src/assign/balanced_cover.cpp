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
// BM_Assign_BalancedCover_16Nodes), so a per-expert list scanned linearly is not enough. reset()
// empties it and keeps its table, so a kept index allocates only beyond the most classes it held.
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
  void reset() {
    if (used_ > 0) std::fill(slots_.begin(), slots_.end(), Slot{});
    used_ = 0;
  }
  size_t capacity_bytes() const { return slots_.capacity() * sizeof(Slot); }

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

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

}  // namespace

namespace detail {

// The classes of one call and everything the class pass, the water-filling and the mapping use,
// as flat arrays (a class's ranks and quotas are ranges of shared lists), so that a kept one
// allocates nothing once it has seen the call's largest sizes. Every call clears or resizes and
// overwrites what it uses; contents on entry do not matter.
struct CoverClassScratch {
  // Per class [C]: its expert, allowed node mask and task count; its allowed ranks are
  // ranks[rank_begin[k] .. rank_begin[k + 1]), ascending.
  std::vector<ExpertId> expert;
  std::vector<uint64_t> allowed;
  std::vector<int64_t> count;
  std::vector<int64_t> rank_begin;  // [C + 1]
  std::vector<RankId> ranks;
  // Classes keyed by (e << N) | allowed (N <= 8): per-chunk key counts [chunks, keys], the class
  // of each key [keys] (-1: none) and the key of each class [C].
  std::vector<int32_t> key_count;
  std::vector<int32_t> class_of_key;
  std::vector<size_t> key_of_class;
  // Classes found through hash indexes: per chunk its index, its classes' (e, mask) and task counts
  // [local ids], and the class of each local id; the index merging them in chunk order.
  struct ChunkClasses {
    ClassIndex index;
    std::vector<std::pair<ExpertId, uint64_t>> key;
    std::vector<int64_t> count;
    std::vector<int32_t> class_of_local;
  };
  std::vector<ChunkClasses> chunk;
  ClassIndex global_index;
  // [chunks, C]: tasks of each class in the chunks before each chunk.
  std::vector<int64_t> chunk_start;
  // Water-filling: the order of the classes [C], rank loads [G], one class's ranks by load and
  // what each gets (positions in its rank list) [ranks of the class].
  std::vector<int32_t> order;
  std::vector<int64_t> load;
  std::vector<uint64_t> node_bit_of_rank;  // [G]
  std::vector<int32_t> by_load;
  std::vector<int64_t> give;
  std::vector<int64_t> give_at;
  // Quotas (rank, tasks) of every class, ascending rank: class k's are quota_*[quota_begin[k] ..
  // quota_begin[k + 1]), with one sentinel at the end. Filled in water-filling order into fill_*
  // first (class k's from fill_begin[k], fill_num[k] of them), then copied in class order.
  std::vector<int64_t> fill_begin;
  std::vector<int64_t> fill_num;
  std::vector<RankId> fill_rank;
  std::vector<int64_t> fill_size;
  std::vector<int64_t> quota_begin;
  std::vector<RankId> quota_rank;
  std::vector<int64_t> quota_size;
  // The mapping, per chunk and class [chunks, C]: the quota the chunk's next task of the class
  // takes and the tasks left in it.
  std::vector<int64_t> current;
  std::vector<int64_t> left;

  size_t num_classes() const { return expert.size(); }

  size_t capacity_bytes() const {
    size_t bytes = bytes_of(expert) + bytes_of(allowed) + bytes_of(count) + bytes_of(rank_begin) +
                   bytes_of(ranks) + bytes_of(key_count) + bytes_of(class_of_key) +
                   bytes_of(key_of_class) + bytes_of(chunk) + global_index.capacity_bytes() +
                   bytes_of(chunk_start) + bytes_of(order) + bytes_of(load) +
                   bytes_of(node_bit_of_rank) + bytes_of(by_load) + bytes_of(give) +
                   bytes_of(give_at) + bytes_of(fill_begin) + bytes_of(fill_num) +
                   bytes_of(fill_rank) + bytes_of(fill_size) + bytes_of(quota_begin) +
                   bytes_of(quota_rank) + bytes_of(quota_size) + bytes_of(current) + bytes_of(left);
    for (const ChunkClasses& own : chunk) {
      bytes += own.index.capacity_bytes() + bytes_of(own.key) + bytes_of(own.count) +
               bytes_of(own.class_of_local);
    }
    return bytes;
  }
};

}  // namespace detail

namespace {

using detail::CoverClassScratch;

// Integer water-filling of class k's tasks onto its ranks given the current loads: repeatedly
// raise the least loaded ranks to the next level. Appends the class's quotas (ascending rank, none
// empty) to the fill lists and adds them to the loads.
void water_fill(CoverClassScratch& s, int32_t k) {
  const RankId* ranks = s.ranks.data() + s.rank_begin[k];
  const auto num_ranks = static_cast<size_t>(s.rank_begin[k + 1] - s.rank_begin[k]);
  std::vector<int64_t>& load = s.load;
  // Positions in the class's rank list by (load, rank): the list is ascending, so a position
  // breaks ties as the rank id would.
  s.by_load.resize(num_ranks);
  std::iota(s.by_load.begin(), s.by_load.end(), 0);
  std::sort(s.by_load.begin(), s.by_load.end(), [&](int32_t a, int32_t b) {
    return load[ranks[a]] < load[ranks[b]] || (load[ranks[a]] == load[ranks[b]] && a < b);
  });
  const auto load_at = [&](size_t i) { return load[ranks[s.by_load[i]]]; };
  s.give.assign(num_ranks, 0);
  int64_t remaining = s.count[k];
  size_t level_count = 1;  // by_load[0 .. level_count) share the current level
  int64_t level = load_at(0);
  while (remaining > 0) {
    while (level_count < num_ranks && load_at(level_count) + s.give[level_count] <= level) {
      ++level_count;
    }
    const int64_t next_level =
        level_count < num_ranks
            ? load_at(level_count)
            : level + (remaining + level_count - 1) / static_cast<int64_t>(level_count);
    const int64_t room = (next_level - level) * static_cast<int64_t>(level_count);
    if (room >= remaining || level_count == num_ranks) {
      // Spread what is left evenly over the current group; the remainder goes to the first ones
      // in (load before this class, rank) order (the header's tie rule).
      const int64_t each = remaining / static_cast<int64_t>(level_count);
      int64_t extra = remaining % static_cast<int64_t>(level_count);
      for (size_t i = 0; i < level_count; ++i) s.give[i] += each + (extra-- > 0 ? 1 : 0);
      remaining = 0;
    } else {
      for (size_t i = 0; i < level_count; ++i) s.give[i] += next_level - level;
      remaining -= room;
      level = next_level;
    }
  }
  // Back to rank order for the quotas.
  s.give_at.resize(num_ranks);
  for (size_t i = 0; i < num_ranks; ++i) s.give_at[s.by_load[i]] = s.give[i];
  s.fill_begin[k] = static_cast<int64_t>(s.fill_rank.size());
  for (size_t p = 0; p < num_ranks; ++p) {
    if (s.give_at[p] == 0) continue;
    load[ranks[p]] += s.give_at[p];
    s.fill_rank.push_back(ranks[p]);
    s.fill_size.push_back(s.give_at[p]);
  }
  s.fill_num[k] = static_cast<int64_t>(s.fill_rank.size()) - s.fill_begin[k];
}

}  // namespace

BalancedCoverWorkspace::BalancedCoverWorkspace() = default;
BalancedCoverWorkspace::~BalancedCoverWorkspace() = default;
BalancedCoverWorkspace::BalancedCoverWorkspace(BalancedCoverWorkspace&&) noexcept = default;
BalancedCoverWorkspace& BalancedCoverWorkspace::operator=(BalancedCoverWorkspace&&) noexcept =
    default;

size_t BalancedCoverWorkspace::capacity_bytes() const {
  return per_token_.capacity() * sizeof(uint64_t) + per_task_.capacity() * sizeof(uint32_t) +
         (classes_ ? classes_->capacity_bytes() : 0) + (spill_ ? spill_->capacity_bytes() : 0);
}

void assign_balanced_cover(const RoutingBatch& batch, const ExpertLayout& layout,
                           const AssignKey& key, const AssignOptions& options,
                           std::span<RankId> exec_rank, double spill_tolerance,
                           BalancedCoverWorkspace* workspace) {
  check_threads(options.num_threads, "assignment");
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "assignment: output holds {} ranks, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  BalancedCoverWorkspace call_workspace;
  BalancedCoverWorkspace& scratch = workspace ? *workspace : call_workspace;
  if (!scratch.classes_) scratch.classes_ = std::make_unique<CoverClassScratch>();
  CoverClassScratch& s = *scratch.classes_;
  const int num_nodes = layout.num_nodes(), per_node = layout.topology().ranks_per_node();
  const int top_k = batch.top_k();
  // Every entry of both is written before it is read (covers here, the task classes by the class
  // pass); a kept buffer of the size is not touched by the resize.
  scratch.per_token_.resize(batch.num_tokens());
  scratch.per_task_.resize(batch.num_tasks());
  const std::span<uint64_t> covers(scratch.per_token_.data(), batch.num_tokens());
  remote_node_covers(batch, layout, key, options, covers);

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
  s.node_bit_of_rank.resize(layout.num_ranks());
  for (RankId r = 0; r < layout.num_ranks(); ++r)
    s.node_bit_of_rank[r] = uint64_t{1} << (r / per_node);
  const uint64_t* node_bit_of_rank = s.node_bit_of_rank.data();
  const RankId* source = batch.source_rank().data();
  const auto reach_of = [&](TokenIdx t) { return covers[t] | node_bit_of_rank[source[t]]; };
  s.expert.clear();
  s.allowed.clear();
  s.count.clear();
  s.ranks.clear();
  s.rank_begin.assign(1, 0);
  const auto new_class = [&](ExpertId e, uint64_t allowed, int64_t count) {
    s.expert.push_back(e);
    s.allowed.push_back(allowed);
    s.count.push_back(count);
    for (uint64_t m = allowed; m; m &= m - 1) {
      auto ranks = layout.ranks_of(e, std::countr_zero(m));
      s.ranks.insert(s.ranks.end(), ranks.begin(), ranks.end());
    }
    s.rank_begin.push_back(static_cast<int64_t>(s.ranks.size()));
    return static_cast<int32_t>(s.expert.size() - 1);
  };
  // [T K] key (use_keys) or chunk-local class id (hash indexes) of each task, both >= 0.
  uint32_t* const task_class = scratch.per_task_.data();
  if (use_keys) {
    s.key_count.assign(num_keys * static_cast<size_t>(num_chunks), 0);
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      int32_t* local = s.key_count.data() + static_cast<size_t>(c) * num_keys;
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
    s.class_of_key.assign(num_keys, -1);
    s.key_of_class.clear();
    for (size_t key = 0; key < num_keys; ++key) {
      int64_t total = 0;
      for (int c = 0; c < num_chunks; ++c)
        total += s.key_count[static_cast<size_t>(c) * num_keys + key];
      if (total == 0) continue;
      s.class_of_key[key] = new_class(static_cast<ExpertId>(key >> num_nodes),
                                      key & ((uint64_t{1} << num_nodes) - 1), total);
      s.key_of_class.push_back(key);
    }
    const size_t num_classes = s.num_classes();
    s.chunk_start.assign(static_cast<size_t>(num_chunks) * num_classes, 0);
    for (size_t k = 0; k < num_classes; ++k) {
      int64_t before = 0;
      for (int c = 0; c < num_chunks; ++c) {
        s.chunk_start[static_cast<size_t>(c) * num_classes + k] = before;
        before += s.key_count[static_cast<size_t>(c) * num_keys + s.key_of_class[k]];
      }
    }
  } else {
    // Per chunk, in parallel: the chunk's own classes (found in its hash index), their task
    // counts, and each task's chunk-local id.
    if (s.chunk.size() < static_cast<size_t>(num_chunks)) s.chunk.resize(num_chunks);
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      CoverClassScratch::ChunkClasses& own = s.chunk[c];
      own.index.reset();
      own.key.clear();
      own.count.clear();
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
    s.global_index.reset();
    for (int c = 0; c < num_chunks; ++c) {
      CoverClassScratch::ChunkClasses& own = s.chunk[c];
      own.class_of_local.resize(own.key.size());
      for (size_t local = 0; local < own.key.size(); ++local) {
        const auto [e, allowed] = own.key[local];
        const auto next = static_cast<int32_t>(s.num_classes());
        const int32_t class_idx = s.global_index.find_or_insert(e, allowed, next);
        if (class_idx == next) new_class(e, allowed, 0);
        own.class_of_local[local] = class_idx;
      }
    }
    const size_t num_classes = s.num_classes();
    s.chunk_start.assign(static_cast<size_t>(num_chunks) * num_classes, 0);
    for (int c = 0; c < num_chunks; ++c) {
      const CoverClassScratch::ChunkClasses& own = s.chunk[c];
      for (size_t local = 0; local < own.key.size(); ++local) {
        const int32_t class_idx = own.class_of_local[local];
        s.chunk_start[static_cast<size_t>(c) * num_classes + class_idx] = s.count[class_idx];
        s.count[class_idx] += own.count[local];
      }
    }
  }
  const size_t num_classes = s.num_classes();
  // Least flexible classes first.
  s.order.resize(num_classes);
  std::iota(s.order.begin(), s.order.end(), 0);
  const auto num_ranks_of = [&](int32_t k) { return s.rank_begin[k + 1] - s.rank_begin[k]; };
  std::sort(s.order.begin(), s.order.end(), [&](int32_t a, int32_t b) {
    if (num_ranks_of(a) != num_ranks_of(b)) return num_ranks_of(a) < num_ranks_of(b);
    if (s.count[a] != s.count[b]) return s.count[a] > s.count[b];
    if (s.expert[a] != s.expert[b]) return s.expert[a] < s.expert[b];
    return s.allowed[a] < s.allowed[b];
  });
  s.load.assign(layout.num_ranks(), 0);
  s.fill_begin.resize(num_classes);
  s.fill_num.resize(num_classes);
  s.fill_rank.clear();
  s.fill_size.clear();
  for (int32_t k : s.order) water_fill(s, k);
  // Tasks take their class's quotas in token order: the p-th task of a class (p counted from the
  // class's first task) runs on the rank of the quota covering position p. The quotas of every
  // class in one flat list (class k's from quota_begin[k]), with one sentinel at the end.
  s.quota_begin.resize(num_classes + 1);
  s.quota_begin[0] = 0;
  for (size_t k = 0; k < num_classes; ++k) s.quota_begin[k + 1] = s.quota_begin[k] + s.fill_num[k];
  s.quota_rank.resize(s.quota_begin.back() + 1);
  s.quota_size.resize(s.quota_begin.back() + 1);
  for (size_t k = 0; k < num_classes; ++k) {
    for (int64_t q = 0; q < s.fill_num[k]; ++q) {
      s.quota_rank[s.quota_begin[k] + q] = s.fill_rank[s.fill_begin[k] + q];
      s.quota_size[s.quota_begin[k] + q] = s.fill_size[s.fill_begin[k] + q];
      // The mapping advances when a quota is used up: an empty one would be skipped wrongly
      // (water_fill emits none).
      COBALT_CHECK_INTERNAL(s.quota_size[s.quota_begin[k] + q] > 0, "balanced cover: empty quota");
    }
  }
  s.quota_rank.back() = 0;
  s.quota_size.back() = 0;
  s.current.resize(static_cast<size_t>(num_chunks) * num_classes);
  s.left.resize(static_cast<size_t>(num_chunks) * num_classes);
  parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
    // Per class: the quota this chunk's next task takes, and the tasks left in it. A class's first
    // task here is at position chunk_start[c, k] of the class: skip the quotas filled before it.
    const int64_t* quota_begin = s.quota_begin.data();
    const RankId* quota_rank = s.quota_rank.data();
    const int64_t* quota_size = s.quota_size.data();
    int64_t* current = s.current.data() + static_cast<size_t>(c) * num_classes;
    int64_t* left = s.left.data() + static_cast<size_t>(c) * num_classes;
    for (size_t k = 0; k < num_classes; ++k) {
      int64_t q = quota_begin[k], skip = s.chunk_start[c * num_classes + k];
      while (q < quota_begin[k + 1] && quota_size[q] <= skip) skip -= quota_size[q++];
      current[k] = q;
      // When every task of class k comes before this chunk, q is past its quotas (the next
      // class's first, or the sentinel) and is never used.
      left[k] = quota_size[q] - skip;
    }
    const uint32_t* task_class_data = task_class;
    const int32_t* class_of = use_keys ? s.class_of_key.data() : s.chunk[c].class_of_local.data();
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
    detail::spill_along_paths(batch, layout, cap, s.load, exec_rank, scratch.per_token_,
                              scratch.per_task_, scratch.spill_.get(), num_threads);
  }
}

}  // namespace cobalt::assign
