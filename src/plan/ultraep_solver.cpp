// UltraEP quota placement on the CPU (see the header for the algorithm and its simplifications).
#include "cobalt/plan/ultraep_solver.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

constexpr int kProbeWarps = 4;       // QUOTA_SOLVER_WARPS: parallel probes per search round
constexpr int kFastOracleTries = 3;  // 1 + QUOTA_ORACLE_FAST_MAX_RETRY

struct Export {
  int expert_local;
  int target_local;
  int64_t quota;
};

// One NVLink domain: M ranks and the experts whose masters live on them.
class DomainSolver {
 public:
  // slots_per_rank: S; rank r of the domain has S - (its masters) replica slots.
  DomainSolver(std::vector<int64_t> loads, std::vector<int> master_begin, int slots_per_rank,
               const UltraEpOptions& options)
      : loads_(std::move(loads)),
        master_begin_(std::move(master_begin)),
        num_ranks_(static_cast<int>(master_begin_.size()) - 1),
        num_experts_(static_cast<int>(loads_.size())),
        options_(options) {
    rank_load_.assign(num_ranks_, 0);
    replica_slots_.resize(num_ranks_);
    sorted_experts_.resize(num_experts_);
    for (int r = 0; r < num_ranks_; ++r) {
      replica_slots_[r] = slots_per_rank - (master_begin_[r + 1] - master_begin_[r]);
      for (int i = master_begin_[r]; i < master_begin_[r + 1]; ++i) rank_load_[r] += loads_[i];
      // Masters by descending load, lower id first.
      std::iota(sorted_experts_.begin() + master_begin_[r],
                sorted_experts_.begin() + master_begin_[r + 1], master_begin_[r]);
      std::stable_sort(sorted_experts_.begin() + master_begin_[r],
                       sorted_experts_.begin() + master_begin_[r + 1],
                       [this](int a, int b) { return loads_[a] > loads_[b]; });
    }
    source_order_.resize(num_ranks_);
    std::iota(source_order_.begin(), source_order_.end(), 0);
    std::stable_sort(source_order_.begin(), source_order_.end(),
                     [this](int a, int b) { return rank_load_[a] > rank_load_[b]; });
    master_of_.resize(num_experts_);
    for (int r = 0; r < num_ranks_; ++r) {
      for (int i = master_begin_[r]; i < master_begin_[r + 1]; ++i) master_of_[i] = r;
    }
  }

  // Runs the kernel's threshold search; fills exports_ and export_sum_ for the chosen threshold.
  void solve() {
    exports_.clear();
    export_sum_.assign(num_experts_, 0);
    threshold_ = *std::max_element(rank_load_.begin(), rank_load_.end());
    // No replica slot in the domain: no binary search, as in the kernel.
    if (num_ranks_ <= 1 || *std::max_element(replica_slots_.begin(), replica_slots_.end()) <= 0) {
      return;
    }
    int64_t total = 0, max_load = 0;
    for (int64_t l : rank_load_) {
      total += l;
      max_load = std::max(max_load, l);
    }
    const float bt = std::max(static_cast<float>(options_.balance_threshold), 1.0f);
    int64_t lo = static_cast<int64_t>(
        std::ceil((static_cast<float>(total) / static_cast<float>(num_ranks_)) * bt));
    const int64_t hi = std::max(max_load, lo);
    // Fast oracle with the dynamic floor.
    const float eps = std::max(static_cast<float>(options_.oracle_eps), 0.0f);
    int64_t fast =
        std::max(static_cast<int64_t>(std::ceil(static_cast<float>(lo) * (1.0f + eps))), lo);
    const int64_t fast_step = std::max<int64_t>(1, (hi + 99) / 100);
    for (int attempt = 0; attempt < kFastOracleTries; ++attempt) {
      if (build(fast, true)) {
        used_fast_oracle_ = true;
        threshold_ = fast;
        return;
      }
      fast = std::min(hi, fast + fast_step);
    }
    // Smallest threshold with total excess <= total slack.
    int64_t coarse_lo = lo, coarse_hi = hi;
    while (coarse_lo < coarse_hi) {
      const int64_t probe = coarse_lo + (coarse_hi - coarse_lo) / 2;
      if (capacity_feasible(probe)) {
        coarse_hi = probe;
      } else {
        coarse_lo = probe + 1;
      }
    }
    lo = coarse_lo;
    int64_t hi_search = hi;
    if (build(lo, false)) {
      threshold_ = lo;
      return;
    }
    lo = std::min(lo + 1, hi_search);
    // The kernel's 4-probe search over [lo, hi).
    while (lo < hi_search) {
      const int64_t range = hi_search - lo;
      int64_t probes[kProbeWarps];
      bool valid[kProbeWarps], feasible[kProbeWarps];
      const bool small = range <= kProbeWarps;
      for (int w = 0; w < kProbeWarps; ++w) {
        probes[w] = small ? lo + w : lo + range * (w + 1) / (kProbeWarps + 1);
        valid[w] = !small || probes[w] < hi_search;
        feasible[w] = valid[w] && build(probes[w], false);
      }
      if (small) {
        int64_t best = -1;
        for (int w = 0; w < kProbeWarps; ++w) {
          if (valid[w] && feasible[w]) {
            best = probes[w];
            break;
          }
        }
        if (best >= 0) {
          lo = hi_search = best;
        } else {
          lo = hi_search;
        }
      } else {
        int first = -1;
        for (int w = 0; w < kProbeWarps; ++w) {
          if (feasible[w]) {
            first = w;
            break;
          }
        }
        if (first >= 0) {
          hi_search = probes[first];
          if (first > 0) lo = probes[first - 1] + 1;
        } else {
          lo = probes[kProbeWarps - 1] + 1;
        }
      }
    }
    const bool ok = build(lo, false);
    COBALT_CHECK_INTERNAL(ok, "ultraep: the plan at threshold {} (max rank load {}) is infeasible",
                          lo, max_load);
    threshold_ = lo;
  }

  const std::vector<Export>& exports() const { return exports_; }
  int64_t export_sum(int i) const { return export_sum_[i]; }
  int64_t threshold() const { return threshold_; }
  bool used_fast_oracle() const { return used_fast_oracle_; }
  int master_of(int i) const { return master_of_[i]; }

 private:
  bool capacity_feasible(int64_t threshold) const {
    int64_t excess = 0, slack = 0;
    for (int64_t l : rank_load_) {
      excess += std::max<int64_t>(l - threshold, 0);
      slack += std::max<int64_t>(threshold - l, 0);
    }
    return excess <= slack;
  }

  // warp_build_export_plan: the greedy export oracle at `threshold`.
  bool build(int64_t threshold, bool dynamic_floor) {
    exports_.clear();
    export_sum_.assign(num_experts_, 0);
    excess_.resize(num_ranks_);
    slack_.resize(num_ranks_);
    slots_used_.assign(num_ranks_, 0);
    occupied_.assign(static_cast<size_t>(num_experts_) * num_ranks_, 0);
    for (int i = 0; i < num_experts_; ++i) {
      occupied_[static_cast<size_t>(i) * num_ranks_ + master_of_[i]] = 1;
    }
    int64_t running_excess = 0, running_slack = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      excess_[r] = std::max<int64_t>(rank_load_[r] - threshold, 0);
      slack_[r] = std::max<int64_t>(threshold - rank_load_[r], 0);
      running_excess += excess_[r];
      running_slack += slack_[r];
    }
    if (running_excess == 0) return true;
    if (running_excess > running_slack) return false;
    for (int src : source_order_) {
      int64_t need = excess_[src];
      if (need <= 0) continue;
      if (need > running_slack) return false;
      for (int pos = master_begin_[src]; pos < master_begin_[src + 1] && need > 0; ++pos) {
        const int i = sorted_experts_[pos];
        const int64_t keep = (!options_.allow_zero_master_quota && loads_[i] > 0) ? 1 : 0;
        int64_t available = std::max<int64_t>(loads_[i] - keep - export_sum_[i], 0);
        uint8_t* occ = occupied_.data() + static_cast<size_t>(i) * num_ranks_;
        while (need > 0 && available > 0) {
          int64_t floor = options_.min_tokens_per_replica;
          if (dynamic_floor) {
            int64_t feasible_slots = 0;
            for (int t = 0; t < num_ranks_; ++t) {
              if (slack_[t] > 0 && slots_used_[t] < replica_slots_[t] && !occ[t]) ++feasible_slots;
            }
            if (feasible_slots == 0) break;
            floor = std::max<int64_t>(1, (need + feasible_slots - 1) / feasible_slots);
          }
          int best = -1;
          for (int t = 0; t < num_ranks_; ++t) {
            if (slack_[t] <= 0 || slots_used_[t] >= replica_slots_[t] || occ[t]) continue;
            if (std::min({need, slack_[t], available}) < floor) continue;
            if (best < 0 || slack_[t] > slack_[best]) best = t;
          }
          if (best < 0) break;
          const int64_t q = std::min({need, slack_[best], available});
          if (q < floor) break;
          exports_.push_back(Export{i, best, q});
          export_sum_[i] += q;
          slack_[best] -= q;
          slots_used_[best] += 1;
          occ[best] = 1;
          running_excess -= q;
          running_slack -= q;
          need -= q;
          available -= q;
        }
      }
      if (need > 0) return false;
      if (running_excess > running_slack) return false;
    }
    return true;
  }

  std::vector<int64_t> loads_;     // [E_d] global loads of the domain's experts
  std::vector<int> master_begin_;  // [M + 1]: masters of local rank r are [begin[r], begin[r+1])
  int num_ranks_, num_experts_;
  std::vector<int> replica_slots_;  // [M]
  UltraEpOptions options_;
  std::vector<int64_t> rank_load_;   // [M]
  std::vector<int> sorted_experts_;  // per rank, masters by descending load
  std::vector<int> source_order_;    // ranks by descending load
  std::vector<int> master_of_;       // [E_d] local master rank
  std::vector<int64_t> excess_, slack_, export_sum_;
  std::vector<int> slots_used_;
  std::vector<uint8_t> occupied_;  // [E_d, M]
  std::vector<Export> exports_;
  int64_t threshold_ = 0;
  bool used_fast_oracle_ = false;
};

// First expert whose master is rank r: ceil(r E / G).
ExpertId first_master(RankId r, int num_experts, int num_ranks) {
  return static_cast<ExpertId>((static_cast<int64_t>(r) * num_experts + num_ranks - 1) / num_ranks);
}

}  // namespace

UltraEpInterleave ultraep_interleave(ExpertId expert, int64_t total) {
  UltraEpInterleave il;
  il.total = total;
  if (total <= 1) return il;
  int64_t stride = total / 2 + 1;
  if (stride >= total) stride = total - 1;
  if (stride < 1) stride = 1;
  while (std::gcd(stride, total) != 1) {
    ++stride;
    if (stride >= total) stride = 1;
  }
  il.stride = stride;
  il.offset = expert % total;
  return il;
}

UltraEpPlan solve_ultraep(const UltraEpInput& in) {
  const int num_ranks = in.topology.num_ranks(), num_experts = in.num_experts;
  COBALT_CHECK_ARG(num_experts >= 1, "ultraep: number of experts {} must be >= 1", num_experts);
  COBALT_CHECK_ARG(in.demand.size() == static_cast<size_t>(num_ranks) * num_experts,
                   "ultraep: demand has {} entries, expected {} ranks x {} experts",
                   in.demand.size(), num_ranks, num_experts);
  const int mains_per_rank = (num_experts + num_ranks - 1) / num_ranks;
  COBALT_CHECK_ARG(in.slots_per_rank >= mains_per_rank,
                   "ultraep: {} slots per rank cannot hold the {} masters per rank",
                   in.slots_per_rank, mains_per_rank);
  const int per_node = in.topology.ranks_per_node();
  const UltraEpOptions& opt = in.options;
  COBALT_CHECK_ARG(std::isfinite(opt.balance_threshold),
                   "ultraep: balance threshold {} must be finite (below 1 acts as 1)",
                   opt.balance_threshold);
  COBALT_CHECK_ARG(std::isfinite(opt.oracle_eps) && opt.oracle_eps >= 0,
                   "ultraep: oracle eps {} must be finite and >= 0", opt.oracle_eps);
  COBALT_CHECK_ARG(opt.min_tokens_per_replica >= 0,
                   "ultraep: min tokens per replica {} must be >= 0", opt.min_tokens_per_replica);
  // At most 2^52 tasks in all (as Policy::run_loads takes), so that every sum below fits.
  constexpr int64_t kMaxTotal = int64_t{1} << 52;
  std::vector<int64_t> expert_load(num_experts, 0);
  int64_t total = 0;
  for (size_t i = 0; i < in.demand.size(); ++i) {
    COBALT_CHECK_ARG(in.demand[i] >= 0, "ultraep: demand[{}][{}] = {} is negative", i / num_experts,
                     i % num_experts, in.demand[i]);
    total += std::min(in.demand[i], kMaxTotal + 1);
    COBALT_CHECK_ARG(total <= kMaxTotal,
                     "ultraep: the demand sums past 2^52 tasks (at "
                     "demand[{}][{}] = {})",
                     i / num_experts, i % num_experts, in.demand[i]);
    expert_load[i % num_experts] += in.demand[i];
  }
  auto demand = [&](RankId s, ExpertId e) {
    return in.demand[static_cast<size_t>(s) * num_experts + e];
  };

  UltraEpPlan plan;
  plan.num_ranks = num_ranks;
  plan.num_experts = num_experts;
  plan.slots_per_rank = in.slots_per_rank;
  plan.slots.assign(static_cast<size_t>(num_ranks) * in.slots_per_rank, kEmptySlot);
  plan.instance_offsets.assign(num_experts + 1, 0);
  plan.thresholds.assign(in.topology.num_nodes(), 0);
  std::vector<std::vector<UltraEpInstance>> instances(num_experts);
  std::vector<int> fill(num_ranks, 0);

  for (NodeId d = 0; d < in.topology.num_nodes(); ++d) {
    const RankId first_rank = in.topology.first_rank_of(d);
    const ExpertId first_e = first_master(first_rank, num_experts, num_ranks);
    const ExpertId end_e = first_master(first_rank + per_node, num_experts, num_ranks);
    std::vector<int> master_begin(per_node + 1);
    for (int r = 0; r <= per_node; ++r) {
      master_begin[r] = first_master(first_rank + r, num_experts, num_ranks) - first_e;
    }
    DomainSolver domain(
        std::vector<int64_t>(expert_load.begin() + first_e, expert_load.begin() + end_e),
        std::move(master_begin), in.slots_per_rank, in.options);
    domain.solve();
    plan.thresholds[d] = domain.threshold();
    plan.num_fast_oracle += domain.used_fast_oracle() ? 1 : 0;
    for (ExpertId e = first_e; e < end_e; ++e) {
      const RankId master = first_rank + domain.master_of(e - first_e);
      instances[e].push_back({master, expert_load[e] - domain.export_sum(e - first_e)});
      plan.slots[static_cast<size_t>(master) * in.slots_per_rank + fill[master]++] = e;
    }
    for (const Export& x : domain.exports()) {
      const ExpertId e = first_e + x.expert_local;
      const RankId target = first_rank + x.target_local;
      instances[e].push_back({target, x.quota});
      plan.slots[static_cast<size_t>(target) * in.slots_per_rank + fill[target]++] = e;
      plan.num_replicas += 1;
    }
  }
  for (ExpertId e = 0; e < num_experts; ++e) {
    plan.instance_offsets[e + 1] =
        plan.instance_offsets[e] + static_cast<int32_t>(instances[e].size());
    plan.instances.insert(plan.instances.end(), instances[e].begin(), instances[e].end());
  }

  // Per-source split (locality-aware rank_quota_prefix) and realised rank loads.
  plan.rank_loads.assign(num_ranks, 0);
  plan.alloc_index.assign(static_cast<size_t>(num_ranks) * num_experts, -1);
  std::vector<int64_t> local_fill, remote_cap, remainder;
  for (ExpertId e = 0; e < num_experts; ++e) {
    const UltraEpInstance* inst = plan.instances.data() + plan.instance_offsets[e];
    const int num_inst = plan.instance_offsets[e + 1] - plan.instance_offsets[e];
    if (num_inst == 1) {
      plan.rank_loads[inst[0].rank] += expert_load[e];
      continue;
    }
    local_fill.assign(num_inst, 0);
    remote_cap.assign(num_inst, 0);
    int64_t total_remote = 0;
    for (int j = 0; j < num_inst; ++j) {
      local_fill[j] = std::min(demand(inst[j].rank, e), inst[j].quota);
      remote_cap[j] = inst[j].quota - local_fill[j];
      total_remote += remote_cap[j];
    }
    for (RankId s = 0; s < num_ranks; ++s) {
      const int64_t own = demand(s, e);
      if (own == 0) continue;
      const int64_t base = static_cast<int64_t>(plan.alloc.size());
      plan.alloc_index[static_cast<size_t>(s) * num_experts + e] = base;
      plan.alloc.resize(base + num_inst, 0);
      int64_t* alloc = plan.alloc.data() + base;
      int64_t rem = own;
      int mine = -1;
      for (int j = 0; j < num_inst; ++j) {
        if (inst[j].rank == s) {
          mine = j;
          alloc[j] += local_fill[j];
          rem -= local_fill[j];
        }
      }
      rem = std::max<int64_t>(rem, 0);
      if (rem > 0 && total_remote > 0) {
        remainder.assign(num_inst, -1);
        int64_t assigned = 0;
        for (int j = 0; j < num_inst; ++j) {
          if (j == mine || remote_cap[j] <= 0) continue;
          // In 128 bits: rem * remote_cap overflows int64 for counts beyond ~3e9.
          const __int128 scaled = static_cast<__int128>(rem) * remote_cap[j];
          alloc[j] += static_cast<int64_t>(scaled / total_remote);
          remainder[j] = static_cast<int64_t>(scaled % total_remote);
          assigned += static_cast<int64_t>(scaled / total_remote);
        }
        for (int64_t left = rem - assigned; left > 0; --left) {
          int best = -1;
          for (int j = 0; j < num_inst; ++j) {
            if (j == mine || remote_cap[j] <= 0) continue;
            if (best < 0 || remainder[j] > remainder[best] ||
                (remainder[j] == remainder[best] && inst[j].rank < inst[best].rank)) {
              best = j;
            }
          }
          COBALT_CHECK_INTERNAL(best >= 0, "ultraep: no instance of expert {} takes source {}", e,
                                s);
          alloc[best] += 1;
          remainder[best] = -1;
        }
      }
      int64_t placed = 0;
      for (int j = 0; j < num_inst; ++j) {
        placed += alloc[j];
        plan.rank_loads[inst[j].rank] += alloc[j];
      }
      COBALT_CHECK_INTERNAL(placed == own, "ultraep: source {} expert {}: {} of {} tasks placed", s,
                            e, placed, own);
    }
  }
  return plan;
}

}  // namespace cobalt::plan
