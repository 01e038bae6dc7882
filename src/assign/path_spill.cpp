#include "path_spill.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <tuple>

#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"

namespace cobalt::assign::detail {
namespace {

// The bookkeeping of one spill run. A replica ("rep") is one (expert, rank) pair of the layout,
// indexed like layout.replica_ranks(). Tasks are listed per replica; an entry is live while the
// task still runs on that replica's rank (moved tasks leave stale entries behind and are appended
// to their new replica's list, so a scan checks liveness).
class PathSpill {
 public:
  static constexpr int64_t kMaxDenseEntries = int64_t{1} << 24;  // 64 MiB of int32
  // Tokens per chunk of the bookkeeping passes, at least (smaller batches run as one chunk).
  static constexpr int64_t kMinChunkTokens = 4096;

  PathSpill(const RoutingBatch& batch, const ExpertLayout& layout, std::vector<int64_t>& load,
            std::span<RankId> exec_rank, std::vector<uint64_t>& reach, std::vector<uint32_t>& tasks,
            ReachCounting counting, SpillScan scan, SpillScratch& scratch, int num_threads)
      : batch_(batch),
        layout_(layout),
        load_(load),
        exec_rank_(exec_rank),
        reach_(reach),
        tasks_(tasks),
        top_k_(batch.top_k()),
        per_node_(layout.topology().ranks_per_node()),
        num_nodes_(layout.num_nodes()),
        num_reps_(layout.num_replicas()),
        use_cursors_(scan == SpillScan::kCursors),
        s_(scratch),
        free_cursor_(scratch.free_cursor),
        rep_rank_(scratch.rep_rank),
        rep_expert_(scratch.rep_expert),
        reps_of_rank_(scratch.reps_of_rank),
        rep_index_(scratch.rep_index),
        node_of_rank_(scratch.node_of_rank),
        offsets_(scratch.offsets),
        scan_begin_(scratch.scan_begin),
        moved_in_(scratch.moved_in),
        count_(scratch.count),
        reach_count_(scratch.reach_count) {
    // Every buffer below is sized and overwritten here (the scratch may hold an earlier run's).
    rep_rank_.assign(layout.replica_ranks().begin(), layout.replica_ranks().end());
    rep_expert_.resize(num_reps_);
    for (ExpertId e = 0; e < layout.num_experts(); ++e) {
      const int base = rep_base(e);
      for (int i = 0; i < layout.num_replicas_of(e); ++i) rep_expert_[base + i] = e;
    }
    reps_of_rank_.resize(layout.num_ranks());
    for (auto& reps : reps_of_rank_) reps.clear();
    for (int a = 0; a < num_reps_; ++a) reps_of_rank_[rep_rank_[a]].push_back(a);
    // Dense (expert, rank) -> replica table when it is small (it is at any realistic E and G);
    // otherwise a binary search in ranks_of(e).
    if (static_cast<int64_t>(layout.num_experts()) * layout.num_ranks() <= kMaxDenseEntries) {
      rep_index_.assign(static_cast<size_t>(layout.num_experts()) * layout.num_ranks(), -1);
      for (int a = 0; a < num_reps_; ++a) {
        rep_index_[static_cast<size_t>(rep_expert_[a]) * layout.num_ranks() + rep_rank_[a]] = a;
      }
    } else {
      rep_index_.clear();
    }
    node_of_rank_.resize(layout.num_ranks());
    for (RankId r = 0; r < layout.num_ranks(); ++r) node_of_rank_[r] = r / per_node_;
    // One pass over the tokens: each token's reach (its source node and the nodes of its tasks),
    // the tasks per replica, and per (replica, node) how many of them have a token reaching the
    // node. Up to 8 nodes a task adds one to its (replica, reach) pair, and the per-node counts
    // come from those pairs after the pass; above, a task adds one per node of its reach. Then the
    // tasks grouped by replica (a counting sort, task order within a replica).
    //
    // Both passes run over contiguous token chunks, in parallel: each chunk tallies its own
    // counts, the tallies are summed in chunk order, and each chunk places its tasks from its
    // replicas' positions after the earlier chunks' tasks. Counts are exact integer sums and every
    // list keeps task order, so the bookkeeping is the same for any number of chunks (one chunk
    // is the plain serial pass).
    const int64_t num_tokens = batch.num_tokens();
    const ExpertId* ids = batch.topk_ids().data();
    reach_.resize(num_tokens);
    const size_t pair_entries = static_cast<size_t>(num_reps_) << 8;
    const bool by_reach_pair = counting == ReachCounting::kByReachSet ||
                               (counting == ReachCounting::kAuto && num_nodes_ <= 8 &&
                                pair_entries <= 4 * static_cast<size_t>(exec_rank.size()));
    COBALT_CHECK_INTERNAL(!by_reach_pair || num_nodes_ <= 8,
                          "chain spill: reach-set counting needs at most 8 nodes, not {}",
                          num_nodes_);
    // Per-chunk tallies: [reps, 256] reach-pair counts, or [reps, N] per-node counts; at most
    // kMaxDenseEntries entries over all chunks (fewer chunks when a layout has many replicas).
    const size_t tally_entries =
        by_reach_pair ? pair_entries : static_cast<size_t>(num_reps_) * num_nodes_;
    const int64_t chunks_by_memory = std::max<int64_t>(
        1, kMaxDenseEntries / static_cast<int64_t>(std::max<size_t>(1, tally_entries)));
    const int num_chunks = static_cast<int>(std::clamp<int64_t>(
        num_tokens / kMinChunkTokens, 1, std::min<int64_t>(num_threads, chunks_by_memory)));
    const size_t reps = static_cast<size_t>(num_reps_);
    std::vector<uint32_t>& chunk_pairs = s_.pair_count;  // [chunks, reps, 256] (by reach pair)
    std::vector<int64_t>& chunk_reach = s_.chunk_reach;  // [chunks, reps, N] (per task)
    std::vector<int64_t>& chunk_count = s_.chunk_count;  // [chunks, reps] tasks per replica
    chunk_pairs.assign(by_reach_pair ? num_chunks * pair_entries : 0, 0);
    chunk_reach.assign(by_reach_pair ? 0 : num_chunks * tally_entries, 0);
    chunk_count.assign(num_chunks * reps, 0);
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      uint32_t* pairs = by_reach_pair ? chunk_pairs.data() + c * pair_entries : nullptr;
      int64_t* per_node = by_reach_pair ? nullptr : chunk_reach.data() + c * tally_entries;
      int64_t* count = chunk_count.data() + c * reps;
      for (TokenIdx t = begin; t < end; ++t) {
        const int64_t row = t * top_k_;
        uint64_t reach = node_bit(node_of_rank_[batch_.source_of(t)]);
        for (int k = 0; k < top_k_; ++k) reach |= node_bit(node_of_rank_[exec_rank_[row + k]]);
        reach_[t] = reach;
        for (int k = 0; k < top_k_; ++k) {
          const int rep = rep_of(ids[row + k], exec_rank_[row + k]);
          if (by_reach_pair) {
            ++pairs[(static_cast<size_t>(rep) << 8) | reach];
          } else {
            ++count[rep];
            int64_t* row_counts = per_node + static_cast<size_t>(rep) * num_nodes_;
            for (uint64_t m = reach; m; m &= m - 1) ++row_counts[std::countr_zero(m)];
          }
        }
      }
      if (by_reach_pair) {
        for (size_t rep = 0; rep < reps; ++rep) {
          const uint32_t* rep_pairs = pairs + (rep << 8);
          int64_t total = 0;
          for (int reach = 0; reach < 256; ++reach) total += rep_pairs[reach];
          count[rep] = total;
        }
      }
    });
    count_.assign(num_reps_, 0);
    reach_count_.assign(reps * num_nodes_, 0);
    for (int c = 0; c < num_chunks; ++c) {
      for (size_t rep = 0; rep < reps; ++rep) count_[rep] += chunk_count[c * reps + rep];
      if (!by_reach_pair) {
        const int64_t* per_node = chunk_reach.data() + c * tally_entries;
        for (size_t i = 0; i < tally_entries; ++i) reach_count_[i] += per_node[i];
      }
    }
    if (by_reach_pair) {
      for (int rep = 0; rep < num_reps_; ++rep) {
        for (uint64_t reach = 0; reach < 256; ++reach) {
          int64_t total = 0;
          for (int c = 0; c < num_chunks; ++c) {
            total += chunk_pairs[c * pair_entries + (static_cast<size_t>(rep) << 8) + reach];
          }
          if (total != 0) add_reach(rep, reach, total);
        }
      }
    }
    offsets_.assign(num_reps_ + 1, 0);
    for (int a = 0; a < num_reps_; ++a) offsets_[a + 1] = offsets_[a] + count_[a];
    // Where each chunk's tasks of each replica start: after the earlier chunks' (in place of the
    // chunk's counts, which are not needed again).
    for (size_t rep = 0; rep < reps; ++rep) {
      int64_t position = offsets_[rep];
      for (int c = 0; c < num_chunks; ++c) {
        const int64_t tasks_here = chunk_count[c * reps + rep];
        chunk_count[c * reps + rep] = position;
        position += tasks_here;
      }
    }
    // Every entry is written below (the batch's T K tasks are few enough to index with 32 bits:
    // spill_along_paths checks); a kept buffer of this size is not touched by the resize.
    tasks_.resize(exec_rank.size());
    parallel_chunks(num_tokens, num_chunks, num_threads, [&](int c, int64_t begin, int64_t end) {
      int64_t* next = chunk_count.data() + c * reps;
      for (int64_t i = begin * top_k_; i < end * top_k_; ++i)
        tasks_[next[rep_of(ids[i], exec_rank_[i])]++] = static_cast<uint32_t>(i);
    });
    scan_begin_.assign(offsets_.begin(), offsets_.end() - 1);
    moved_in_.resize(num_reps_);
    for (auto& moved : moved_in_) moved.clear();
    if (use_cursors_) {
      free_cursor_.resize(static_cast<size_t>(num_reps_) * num_nodes_);
      for (int a = 0; a < num_reps_; ++a) reset_cursors(a);
    }
  }

  void run(int64_t cap) {
    const int num_ranks = layout_.num_ranks();
    for (;;) {
      RankId source = 0;
      for (RankId r = 1; r < num_ranks; ++r) {
        if (load_[r] > load_[source]) source = r;
      }
      if (load_[source] <= cap) return;
      if (!augment(source, cap)) return;
    }
  }

 private:
  // An augmentation's distance to a rank: (edges that add a cross-node copy, edges); unreached
  // ranks at (max, 0).
  using Dist = std::pair<int, int>;
  static constexpr Dist kUnreached{std::numeric_limits<int>::max(), 0};

  static uint64_t node_bit(int node) { return uint64_t{1} << node; }
  int rep_base(ExpertId e) const {
    return static_cast<int>(layout_.ranks_of(e).data() - layout_.replica_ranks().data());
  }
  int rep_of(ExpertId e, RankId rank) const {
    if (!rep_index_.empty()) return rep_index_[static_cast<size_t>(e) * layout_.num_ranks() + rank];
    const auto ranks = layout_.ranks_of(e);
    return rep_base(e) +
           static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), rank) - ranks.begin());
  }
  void add_reach(int rep, uint64_t reach, int64_t delta) {
    int64_t* row = reach_count_.data() + static_cast<size_t>(rep) * num_nodes_;
    for (uint64_t m = reach; m; m &= m - 1) row[std::countr_zero(m)] += delta;
  }
  int64_t free_tasks(int rep, int node) const {
    return reach_count_[static_cast<size_t>(rep) * num_nodes_ + node];
  }
  // Where the free pass of replica `rep` towards `node` resumes: a position in its original list
  // (offsets_) and, once that list is exhausted, an index into moved_in_[rep].
  using Cursor = SpillCursor;
  Cursor& cursor_of(int rep, int node) {
    return free_cursor_[static_cast<size_t>(rep) * num_nodes_ + node];
  }
  void reset_cursors(int rep) {
    for (int n = 0; n < num_nodes_; ++n) cursor_of(rep, n) = Cursor{offsets_[rep], 0};
  }

  // One augmentation from `source`; false when no target is reachable.
  bool augment(RankId source, int64_t cap) {
    const int num_ranks = layout_.num_ranks();
    std::vector<Dist>& dist = s_.dist;
    std::vector<int>& parent_rep = s_.parent_rep;  // rep moved along the edge into this rank
    std::vector<char>& done = s_.done;
    dist.assign(num_ranks, kUnreached);
    parent_rep.assign(num_ranks, -1);
    done.assign(num_ranks, 0);
    // Dijkstra with a binary heap of (paid, hops, rank), smallest first (a min-heap under
    // std::greater, as std::priority_queue would keep it).
    auto& heap = s_.heap;
    heap.clear();
    const auto push = [&](int paid, int hops, RankId v) {
      heap.emplace_back(paid, hops, v);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    dist[source] = {0, 0};
    push(0, 0, source);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const auto [paid, hops, u] = heap.back();
      heap.pop_back();
      if (done[u]) continue;
      done[u] = 1;
      for (int a : reps_of_rank_[u]) {
        if (count_[a] == 0) continue;
        for (RankId v : layout_.ranks_of(rep_expert_[a])) {
          if (v == u || done[v]) continue;
          const Dist next{paid + (free_tasks(a, v / per_node_) > 0 ? 0 : 1), hops + 1};
          if (next < dist[v]) {
            dist[v] = next;
            parent_rep[v] = a;
            push(next.first, next.second, v);
          }
        }
      }
    }
    const int64_t source_load = load_[source];
    auto pick = [&](auto eligible) {
      RankId best = -1;
      for (RankId v = 0; v < num_ranks; ++v) {
        if (v == source || !done[v] || !eligible(load_[v])) continue;
        if (best < 0 || std::make_tuple(dist[v].first, dist[v].second, load_[v]) <
                            std::make_tuple(dist[best].first, dist[best].second, load_[best])) {
          best = v;
        }
      }
      return best;
    };
    RankId target = pick([&](int64_t l) { return l < cap; });
    int64_t delta = 0;
    if (target >= 0) {
      delta = std::min(source_load - cap, cap - load_[target]);
    } else {
      target = pick([&](int64_t l) { return l <= source_load - 2; });
      if (target < 0) return false;
      delta = (source_load - load_[target]) / 2;
    }
    // The path, target back to source, and its edge capacities.
    auto& path = s_.path;  // (rep on the sending rank, receiving rank)
    path.clear();
    for (RankId v = target; v != source;) {
      const int a = parent_rep[v];
      const bool free = free_tasks(a, v / per_node_) > 0;
      delta = std::min(delta, free ? free_tasks(a, v / per_node_) : count_[a]);
      path.emplace_back(a, v);
      v = rep_rank_[a];
    }
    for (const auto& [a, v] : path) move_tasks(a, v, delta);
    load_[source] -= delta;
    load_[target] += delta;
    return true;
  }

  // Moves `num` live tasks of replica `from` to the replica of the same expert on `to_rank`: tasks
  // whose token reaches to_rank's node first, then any (each adds that node to its token's reach).
  void move_tasks(int from, RankId to_rank, int64_t num) {
    const int to = rep_of(rep_expert_[from], to_rank);
    const int to_node = to_rank / per_node_;
    for (int pass = 0; pass < 2 && num > 0; ++pass) {
      const bool want_free = pass == 0;
      // Moving a free task lowers free_tasks(from, to_node) by exactly one (a token's other tasks
      // are on other replicas), so the free pass stops when none is left.
      const auto wanted = [&] { return num > 0 && (!want_free || free_tasks(from, to_node) > 0); };
      auto visit = [&](int64_t task) {
        if (exec_rank_[task] != rep_rank_[from]) return;
        const bool free = (reach_[task / top_k_] >> to_node) & 1;
        if (free != want_free) return;
        move_one(task, from, to);
        --num;
      };
      // Stale entries at the front of the original list are skipped for good.
      int64_t& begin = scan_begin_[from];
      while (begin < offsets_[from + 1] && exec_rank_[tasks_[begin]] != rep_rank_[from]) ++begin;
      // The free pass resumes where the last one for this node stopped: the entries before are
      // moved away or have no token reaching the node (see SpillScan).
      Cursor* cursor = want_free && use_cursors_ ? &cursor_of(from, to_node) : nullptr;
      int64_t pos = cursor ? std::max(begin, cursor->list) : begin;
      for (; pos < offsets_[from + 1] && wanted(); ++pos) visit(tasks_[pos]);
      const auto& extra = moved_in_[from];  // visit() appends to other replicas' lists only
      size_t i = cursor && pos == offsets_[from + 1] ? cursor->moved_in : 0;
      for (; i < extra.size() && wanted(); ++i) visit(extra[i]);
      if (cursor) {
        cursor->list = pos;
        if (pos == offsets_[from + 1]) cursor->moved_in = i;
      }
      // The free pass stops only when it has moved enough or no free task is left: one it did not
      // find (a cursor past a task that qualifies again) would be replaced silently by pass 1.
      COBALT_CHECK_INTERNAL(!want_free || num == 0 || free_tasks(from, to_node) == 0,
                            "chain spill: {} free tasks of replica {} towards node {} not found",
                            free_tasks(from, to_node), from, to_node);
    }
  }

  void move_one(int64_t task, int from, int to) {
    const TokenIdx t = task / top_k_;
    const int src_node = node_of_rank_[batch_.source_of(t)];
    const int64_t row = t * top_k_;
    // The task leaves its replica's counts with the token's current reach.
    --count_[from];
    add_reach(from, reach_[t], -1);
    exec_rank_[task] = rep_rank_[to];
    moved_in_[to].push_back(task);
    // An entry of `to`'s lists may be live again (the task moved back): its searches restart.
    if (use_cursors_) reset_cursors(to);
    // Update the token's reach and, for its other tasks, their replicas' per-node counts.
    uint64_t new_reach = node_bit(src_node);
    for (int k = 0; k < top_k_; ++k) new_reach |= node_bit(node_of_rank_[exec_rank_[row + k]]);
    const uint64_t changed = new_reach ^ reach_[t];
    if (changed != 0) {
      for (int k = 0; k < top_k_; ++k) {
        if (row + k == task) continue;
        const int rep = rep_of(batch_.topk_ids()[row + k], exec_rank_[row + k]);
        add_reach(rep, changed & reach_[t], -1);
        add_reach(rep, changed & new_reach, +1);
        // The token now reaches these nodes: its task on `rep` may qualify for them again.
        if (use_cursors_) {
          for (uint64_t m = changed & new_reach; m; m &= m - 1) {
            cursor_of(rep, std::countr_zero(m)) = Cursor{offsets_[rep], 0};
          }
        }
      }
      reach_[t] = new_reach;
    }
    ++count_[to];
    add_reach(to, reach_[t], +1);
  }

  const RoutingBatch& batch_;
  const ExpertLayout& layout_;
  std::vector<int64_t>& load_;
  std::span<RankId> exec_rank_;
  std::vector<uint64_t>& reach_;  // [T] nodes each token reaches (caller's scratch)
  std::vector<uint32_t>& tasks_;  // [T K] task indices grouped by original replica (scratch)
  const int top_k_, per_node_, num_nodes_, num_reps_;
  const bool use_cursors_;
  // The rest lives in the scratch (path_spill.hpp: SpillScratch, shapes there).
  SpillScratch& s_;
  std::vector<Cursor>& free_cursor_;
  std::vector<RankId>& rep_rank_;
  std::vector<ExpertId>& rep_expert_;
  std::vector<std::vector<int>>& reps_of_rank_;
  std::vector<int32_t>& rep_index_;
  std::vector<int>& node_of_rank_;
  std::vector<int64_t>& offsets_;  // into tasks_
  std::vector<int64_t>& scan_begin_;
  std::vector<std::vector<uint32_t>>& moved_in_;
  std::vector<int64_t>& count_;
  std::vector<int64_t>& reach_count_;
};

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}
template <typename T>
size_t bytes_of(const std::vector<std::vector<T>>& v) {
  size_t bytes = v.capacity() * sizeof(std::vector<T>);
  for (const auto& inner : v) bytes += bytes_of(inner);
  return bytes;
}

}  // namespace

size_t SpillScratch::capacity_bytes() const {
  return bytes_of(rep_rank) + bytes_of(rep_expert) + bytes_of(reps_of_rank) + bytes_of(rep_index) +
         bytes_of(node_of_rank) + bytes_of(offsets) + bytes_of(scan_begin) + bytes_of(chunk_reach) +
         bytes_of(moved_in) + bytes_of(count) + bytes_of(reach_count) + bytes_of(pair_count) +
         bytes_of(chunk_count) + bytes_of(free_cursor) + bytes_of(dist) + bytes_of(parent_rep) +
         bytes_of(done) + bytes_of(heap) + bytes_of(path);
}

bool spill_target_reachable(const ExpertLayout& layout, std::span<const int64_t> load,
                            int64_t cap) {
  const int num_ranks = layout.num_ranks();
  RankId source = 0;
  for (RankId r = 1; r < num_ranks; ++r) {
    if (load[r] > load[source]) source = r;
  }
  const int64_t source_load = load[source];
  std::vector<char> seen(num_ranks, 0);
  std::vector<RankId> frontier;
  frontier.reserve(
      num_ranks);  // each rank enters once: two allocations per call, whatever the search
  frontier.push_back(source);
  seen[source] = 1;
  while (!frontier.empty()) {
    const RankId u = frontier.back();
    frontier.pop_back();
    for (ExpertId e : layout.slots_of(u)) {
      if (e == kEmptySlot) continue;
      for (RankId v : layout.ranks_of(e)) {
        if (seen[v]) continue;
        // pick()'s two conditions (below the cap implies two lighter whenever the busiest rank
        // is above the cap, as here, but the spill states both).
        if (load[v] < cap || load[v] <= source_load - 2) return true;
        seen[v] = 1;
        frontier.push_back(v);
      }
    }
  }
  return false;
}

void spill_along_paths(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                       std::vector<int64_t>& load, std::span<RankId> exec_rank,
                       std::vector<uint64_t>& per_token, std::vector<uint32_t>& per_task,
                       SpillScratch* scratch, int num_threads) {
  // Nothing to do (the common case once balanced): skip the O(T K) bookkeeping.
  if (load.empty() || *std::max_element(load.begin(), load.end()) <= cap) return;
  // Nothing can move (the common case once a layout balances as well as it can): skip it too.
  if (!spill_target_reachable(layout, load, cap)) return;
  spill_along_paths_unchecked(batch, layout, cap, load, exec_rank, per_token, per_task,
                              ReachCounting::kAuto, SpillScan::kCursors, scratch, num_threads);
}

void spill_along_paths(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                       std::vector<int64_t>& load, std::span<RankId> exec_rank) {
  std::vector<uint64_t> per_token;
  std::vector<uint32_t> per_task;
  spill_along_paths(batch, layout, cap, load, exec_rank, per_token, per_task);
}

void spill_along_paths_unchecked(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                                 std::vector<int64_t>& load, std::span<RankId> exec_rank,
                                 ReachCounting counting, SpillScan scan) {
  std::vector<uint64_t> per_token;
  std::vector<uint32_t> per_task;
  spill_along_paths_unchecked(batch, layout, cap, load, exec_rank, per_token, per_task, counting,
                              scan);
}

void spill_along_paths_unchecked(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                                 std::vector<int64_t>& load, std::span<RankId> exec_rank,
                                 std::vector<uint64_t>& per_token, std::vector<uint32_t>& per_task,
                                 ReachCounting counting, SpillScan scan, SpillScratch* scratch,
                                 int num_threads) {
  COBALT_CHECK(exec_rank.size() <= std::numeric_limits<uint32_t>::max(), kFailedPrecondition,
               "balanced assignment: the chain spill indexes tasks with 32 bits; this batch has {} "
               "tasks (split the step into batches of fewer than 2^32 tasks)",
               exec_rank.size());
  COBALT_CHECK_INTERNAL(num_threads >= 1, "chain spill: {} threads", num_threads);
  SpillScratch own;
  PathSpill(batch, layout, load, exec_rank, per_token, per_task, counting, scan,
            scratch ? *scratch : own, num_threads)
      .run(cap);
}

}  // namespace cobalt::assign::detail
