// ExpertLayout: which expert each replica slot of each rank holds. Immutable once built; planners
// return new layouts. Validated on construction: every expert has >= 1 replica, no rank holds two
// replicas of one expert, every slot id is an expert id or kEmptySlot.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt {

// Slot budgets. Both are capped at E: a rank never holds two replicas of one expert, so more slots
// cannot be used.
// Cobalt's: S = floor((1 + rho) * E / G). Throws kFailedPrecondition when S * G < E (not every
// expert can have a replica: e.g. rho = 0 with G not dividing E, as E = 60 on G = 16) and
// kInvalidArgument when rho < 0.
int slots_for_rho(int num_experts, int num_ranks, double rho);
// TopoEP's: S = ceil(E / G) + extra_slots (extra_slots >= 0).
int slots_for_extra(int num_experts, int num_ranks, int extra_slots);

class ExpertLayout {
 public:
  // slots: [G, slots_per_rank] row-major expert ids, kEmptySlot where unused. E and
  // slots_per_rank in [1, 65536] (kInvalidArgument, checked by the builders below too before they
  // allocate).
  ExpertLayout(Topology topology, int num_experts, int slots_per_rank, std::vector<ExpertId> slots);

  // Builds the layout from per-rank expert lists (each list no longer than slots_per_rank; a
  // kEmptySlot entry is an empty slot, as in the constructor's slots).
  static ExpertLayout from_rank_lists(Topology topology, int num_experts, int slots_per_rank,
                                      const std::vector<std::vector<ExpertId>>& experts_of_rank);

  // Static EP: expert e on rank floor(e * G / E), one replica each. Throws kFailedPrecondition,
  // as the constructor does, when G x slots_per_rank < E.
  static ExpertLayout static_ep(Topology topology, int num_experts, int slots_per_rank);

  const Topology& topology() const { return topology_; }
  int num_experts() const { return num_experts_; }
  int num_ranks() const { return topology_.num_ranks(); }
  int num_nodes() const { return topology_.num_nodes(); }
  int slots_per_rank() const { return slots_per_rank_; }
  int num_replicas() const { return static_cast<int>(replica_ranks_.size()); }

  // The accessors below take ids in range (rank in [0, G), e in [0, E), n in [0, N)) and do not
  // check them: the hot loops call them per task. Inputs are range-checked where they enter
  // (RoutingBatch, the constructors, the policies).
  // [G, slots_per_rank]
  std::span<const ExpertId> slots() const { return slots_; }
  std::span<const ExpertId> slots_of(RankId rank) const {
    return std::span<const ExpertId>(slots_).subspan(static_cast<size_t>(rank) * slots_per_rank_,
                                                     slots_per_rank_);
  }
  // Ranks holding expert e, ascending.
  std::span<const RankId> ranks_of(ExpertId e) const {
    return std::span<const RankId>(replica_ranks_)
        .subspan(replica_offsets_[e], replica_offsets_[e + 1] - replica_offsets_[e]);
  }
  int num_replicas_of(ExpertId e) const { return replica_offsets_[e + 1] - replica_offsets_[e]; }
  // Ranks of node n holding expert e, ascending (R_{e,n}).
  std::span<const RankId> ranks_of(ExpertId e, NodeId n) const {
    const size_t idx = static_cast<size_t>(e) * num_nodes() + n;
    return std::span<const RankId>(replica_ranks_)
        .subspan(node_offsets_[idx], node_offsets_[idx + 1] - node_offsets_[idx]);
  }
  // Bit n set when node n holds a replica of e.
  uint64_t node_mask(ExpertId e) const { return node_mask_[e]; }
  std::span<const uint64_t> node_masks() const { return node_mask_; }
  bool holds(RankId rank, ExpertId e) const {
    const size_t bit = static_cast<size_t>(e) * num_ranks() + rank;
    return (holds_[bit >> 6] >> (bit & 63)) & 1;
  }
  int num_used_slots(RankId rank) const;

  // Raw derived maps for hot loops: ranks of (e, n) are replica_ranks()[o[e*N+n] .. o[e*N+n+1])
  // with o = node_offsets() [E*N + 1].
  std::span<const int32_t> node_offsets() const { return node_offsets_; }
  std::span<const RankId> replica_ranks() const { return replica_ranks_; }

  bool operator==(const ExpertLayout& other) const {
    return topology_ == other.topology_ && num_experts_ == other.num_experts_ &&
           slots_per_rank_ == other.slots_per_rank_ && slots_ == other.slots_;
  }

  std::string to_json()
      const;  // {"num_experts", "nodes", "ranks", "slots_per_rank", "slots": [[..]..]}

 private:
  Topology topology_;
  int num_experts_;
  int slots_per_rank_;
  std::vector<ExpertId> slots_;           // [G * S]
  std::vector<int32_t> replica_offsets_;  // [E + 1] into replica_ranks_
  std::vector<RankId> replica_ranks_;     // ranks grouped by expert, ascending within each
  std::vector<int32_t> node_offsets_;     // [E * N + 1] into replica_ranks_ (same order)
  std::vector<uint64_t> node_mask_;       // [E]
  std::vector<uint64_t> holds_;           // [ceil(E * G / 64)]: bit e * G + r set when r holds e
};

// One replica a new layout needs that the old one did not have on that rank. The parameters come
// from src_rank: a holder in the old layout, or the destination of an earlier move of the same
// expert on dst_rank's node (see diff()).
struct ReplicaMove {
  ExpertId expert;
  RankId src_rank;
  RankId dst_rank;
  bool cross_node;
};

struct LayoutDiff {
  std::vector<ReplicaMove> moves;
  int64_t num_intra_node = 0;  // NVLink copies
  int64_t num_cross_node = 0;  // copies over the inter-node fabric
  int64_t num_removed = 0;     // replicas dropped (free)
};

// Replica moves that turn layout `from` into layout `to` (same topology and E), in rank order. A
// new replica copies from a holder on its own node when `from` has one (NVLink), else the first new
// replica of the expert on that node copies from the expert's lowest holder over the fabric and
// the node's other new replicas copy from it (NVLink): one inter-node copy per (expert, node).
// So the moves are ordered: a move may copy from the destination of an earlier move (apply them in
// order, or the fabric copies first).
LayoutDiff diff(const ExpertLayout& from, const ExpertLayout& to);

}  // namespace cobalt
