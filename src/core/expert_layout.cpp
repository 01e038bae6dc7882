#include "cobalt/core/expert_layout.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "cobalt/core/error.hpp"

namespace cobalt {

namespace {

// floor((1 + rho) E / G) capped at E: more than E slots cannot be used (a rank never holds two
// replicas of one expert), computed in double so a huge rho cannot overflow.
int rho_slots(int num_experts, int num_ranks, double rho) {
  return static_cast<int>(
      std::min<double>(num_experts, std::floor((1.0 + rho) * num_experts / num_ranks + 1e-9)));
}

// E and G in the ranges every layout and topology accepts (so ceil(E / G) cannot overflow).
void check_budget_sizes(int num_experts, int num_ranks) {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "replica budget: number of experts {} out of range [1, {}]", num_experts,
                   kMaxExperts);
  COBALT_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxRanks,
                   "replica budget: number of ranks {} out of range [1, {}]", num_ranks, kMaxRanks);
}

}  // namespace

int slots_for_rho(int num_experts, int num_ranks, double rho) {
  COBALT_CHECK_ARG(rho >= 0 && std::isfinite(rho), "replica budget rho {} must be >= 0", rho);
  check_budget_sizes(num_experts, num_ranks);
  const int slots = rho_slots(num_experts, num_ranks, rho);
  if (static_cast<int64_t>(slots) * num_ranks < num_experts) {
    // The smallest rho with ceil(E / G) slots, rounded up to the 4 decimals printed (2/7 is shown
    // as 0.2858, not as 0.2857, which is too small), so the value suggested works when passed.
    const int needed = (num_experts + num_ranks - 1) / num_ranks;
    const double exact = static_cast<double>(needed) * num_ranks / num_experts - 1.0;
    double suggested = std::ceil(exact * 1e4) / 1e4;
    if (suggested >= 1e-4 && rho_slots(num_experts, num_ranks, suggested - 1e-4) >= needed) {
      suggested -= 1e-4;  // exact * 1e4 was a whole number plus rounding error
    }
    fail(ErrorCode::kFailedPrecondition,
         "replica budget too small: rho {} gives {} slots per rank x {} ranks = {} < {} experts; "
         "need rho >= {:.4f}",
         rho, slots, num_ranks, static_cast<int64_t>(slots) * num_ranks, num_experts, suggested);
  }
  return slots;
}

int slots_for_extra(int num_experts, int num_ranks, int extra_slots) {
  COBALT_CHECK_ARG(extra_slots >= 0, "extra replica slots {} must be >= 0", extra_slots);
  check_budget_sizes(num_experts, num_ranks);
  // Capped at E, as slots_for_rho.
  return static_cast<int>(std::min<int64_t>(
      num_experts, int64_t{(num_experts + num_ranks - 1) / num_ranks} + extra_slots));
}

namespace {

// E and S in range, checked before anything is allocated from them.
void check_layout_sizes(int num_experts, int slots_per_rank) {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "layout: number of experts {} out of range [1, {}]", num_experts, kMaxExperts);
  COBALT_CHECK_ARG(slots_per_rank >= 1 && slots_per_rank <= kMaxExperts,
                   "layout: slots per rank {} out of range [1, {}]", slots_per_rank, kMaxExperts);
}

}  // namespace

ExpertLayout::ExpertLayout(Topology topology, int num_experts, int slots_per_rank,
                           std::vector<ExpertId> slots)
    : topology_(topology),
      num_experts_(num_experts),
      slots_per_rank_(slots_per_rank),
      slots_(std::move(slots)) {
  const int num_ranks = topology_.num_ranks();
  const int num_nodes = topology_.num_nodes();
  check_layout_sizes(num_experts, slots_per_rank);
  COBALT_CHECK_ARG(slots_.size() == static_cast<size_t>(num_ranks) * slots_per_rank,
                   "layout: {} slot entries, expected ranks {} x slots {} = {}", slots_.size(),
                   num_ranks, slots_per_rank, static_cast<size_t>(num_ranks) * slots_per_rank);
  COBALT_CHECK(static_cast<int64_t>(num_ranks) * slots_per_rank >= num_experts, kFailedPrecondition,
               "layout: {} ranks x {} slots cannot hold {} experts", num_ranks, slots_per_rank,
               num_experts);

  holds_.assign((static_cast<size_t>(num_experts) * num_ranks + 63) / 64, 0);
  std::vector<int32_t> count(num_experts, 0);
  for (RankId r = 0; r < num_ranks; ++r) {
    for (int s = 0; s < slots_per_rank; ++s) {
      const ExpertId e = slots_[static_cast<size_t>(r) * slots_per_rank + s];
      if (e == kEmptySlot) continue;
      COBALT_CHECK_ARG(
          e >= 0 && e < num_experts,
          "layout: rank {} slot {} holds expert id {} out of range [0, {}) (or -1 empty)", r, s, e,
          num_experts);
      const size_t bit = static_cast<size_t>(e) * num_ranks + r;
      uint64_t& word = holds_[bit >> 6];
      const uint64_t mask = uint64_t{1} << (bit & 63);
      COBALT_CHECK_ARG(!(word & mask), "layout: rank {} holds two replicas of expert {}", r, e);
      word |= mask;
      ++count[e];
    }
  }
  replica_offsets_.assign(num_experts + 1, 0);
  for (ExpertId e = 0; e < num_experts; ++e) {
    COBALT_CHECK_ARG(count[e] >= 1,
                     "layout: expert {} has no replica (every expert in [0, {}) needs one)", e,
                     num_experts);
    replica_offsets_[e + 1] = replica_offsets_[e] + count[e];
  }
  // Each expert's ranks ascending: place ranks in rank order into their experts' ranges
  // (O(G S + E N), not a scan of the E x G table).
  replica_ranks_.resize(replica_offsets_[num_experts]);
  std::vector<int32_t> cursor(replica_offsets_.begin(), replica_offsets_.end() - 1);
  for (RankId r = 0; r < num_ranks; ++r) {
    for (int s = 0; s < slots_per_rank; ++s) {
      const ExpertId e = slots_[static_cast<size_t>(r) * slots_per_rank + s];
      if (e != kEmptySlot) replica_ranks_[cursor[e]++] = r;
    }
  }
  node_offsets_.assign(static_cast<size_t>(num_experts) * num_nodes + 1, 0);
  node_mask_.assign(num_experts, 0);
  for (ExpertId e = 0; e < num_experts; ++e) {
    int32_t pos = replica_offsets_[e];
    for (NodeId n = 0; n < num_nodes; ++n) {
      const RankId end_rank = topology_.first_rank_of(n) + topology_.ranks_per_node();
      if (pos < replica_offsets_[e + 1] && replica_ranks_[pos] < end_rank) {
        node_mask_[e] |= uint64_t{1} << n;
        while (pos < replica_offsets_[e + 1] && replica_ranks_[pos] < end_rank) ++pos;
      }
      node_offsets_[static_cast<size_t>(e) * num_nodes + n + 1] = pos;
    }
  }
}

ExpertLayout ExpertLayout::from_rank_lists(
    Topology topology, int num_experts, int slots_per_rank,
    const std::vector<std::vector<ExpertId>>& experts_of_rank) {
  check_layout_sizes(num_experts, slots_per_rank);
  COBALT_CHECK_ARG(static_cast<int>(experts_of_rank.size()) == topology.num_ranks(),
                   "layout: {} rank lists for {} ranks", experts_of_rank.size(),
                   topology.num_ranks());
  std::vector<ExpertId> slots(static_cast<size_t>(topology.num_ranks()) * slots_per_rank,
                              kEmptySlot);
  for (RankId r = 0; r < topology.num_ranks(); ++r) {
    const auto& list = experts_of_rank[r];
    COBALT_CHECK_ARG(static_cast<int>(list.size()) <= slots_per_rank,
                     "layout: rank {} has {} replicas but only {} slots", r, list.size(),
                     slots_per_rank);
    std::copy(list.begin(), list.end(), slots.begin() + static_cast<size_t>(r) * slots_per_rank);
  }
  return ExpertLayout(topology, num_experts, slots_per_rank, std::move(slots));
}

ExpertLayout ExpertLayout::static_ep(Topology topology, int num_experts, int slots_per_rank) {
  check_layout_sizes(num_experts, slots_per_rank);
  const int num_ranks = topology.num_ranks();
  // As the constructor words it (G S >= E also gives every rank its ceil(E / G) slots).
  COBALT_CHECK(static_cast<int64_t>(num_ranks) * slots_per_rank >= num_experts, kFailedPrecondition,
               "layout: {} ranks x {} slots cannot hold {} experts", num_ranks, slots_per_rank,
               num_experts);
  std::vector<std::vector<ExpertId>> lists(num_ranks);
  for (ExpertId e = 0; e < num_experts; ++e) {
    lists[static_cast<int64_t>(e) * num_ranks / num_experts].push_back(e);
  }
  return from_rank_lists(topology, num_experts, slots_per_rank, lists);
}

int ExpertLayout::num_used_slots(RankId rank) const {
  int used = 0;
  for (ExpertId e : slots_of(rank)) used += e != kEmptySlot;
  return used;
}

std::string ExpertLayout::to_json() const {
  nlohmann::json j;
  j["num_experts"] = num_experts_;
  j["nodes"] = topology_.num_nodes();
  j["ranks"] = topology_.num_ranks();
  j["slots_per_rank"] = slots_per_rank_;
  nlohmann::json rows = nlohmann::json::array();
  for (RankId r = 0; r < num_ranks(); ++r) {
    auto row = slots_of(r);
    rows.push_back(std::vector<ExpertId>(row.begin(), row.end()));
  }
  j["slots"] = std::move(rows);
  return j.dump();
}

LayoutDiff diff(const ExpertLayout& from, const ExpertLayout& to) {
  COBALT_CHECK_ARG(from.topology() == to.topology() && from.num_experts() == to.num_experts(),
                   "layout diff: layouts differ in topology ({} vs {}) or experts ({} vs {})",
                   from.topology().to_string(), to.topology().to_string(), from.num_experts(),
                   to.num_experts());
  const Topology& topo = from.topology();
  LayoutDiff result;
  // (expert, node) pairs that receive the expert over the fabric in this diff -> the rank that
  // receives it: further new replicas on that node copy from there over NVLink (one inter-node
  // copy per node, as for tokens).
  std::unordered_map<int64_t, RankId> arrived;
  for (RankId r = 0; r < to.num_ranks(); ++r) {
    for (ExpertId e : to.slots_of(r)) {
      if (e == kEmptySlot || from.holds(r, e)) continue;
      const NodeId node = topo.node_of(r);
      auto local = from.ranks_of(e, node);
      ReplicaMove move{e, 0, r, false};
      if (!local.empty()) {
        move.src_rank = local.front();
      } else {
        const int64_t key = static_cast<int64_t>(e) * topo.num_nodes() + node;
        const auto [it, first] = arrived.emplace(key, r);
        move.cross_node = first;
        move.src_rank = first ? from.ranks_of(e).front() : it->second;
      }
      (move.cross_node ? result.num_cross_node : result.num_intra_node) += 1;
      result.moves.push_back(move);
    }
    for (ExpertId e : from.slots_of(r)) {
      if (e != kEmptySlot && !to.holds(r, e)) ++result.num_removed;
    }
  }
  return result;
}

}  // namespace cobalt
