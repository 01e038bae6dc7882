// Topology: N nodes of M ranks each (G = N*M ranks, rank r lives on node r / M), plus the link
// parameters the cost model needs.
#pragma once

#include <string>

#include "cobalt/core/ids.hpp"

namespace cobalt {

struct LinkParams {
  double nvlink_bytes_per_s = 900e9;       // per GPU, one way
  double ib_bytes_per_s_per_node = 400e9;  // per node, one way (sum of the node's NICs)
};

class Topology {
 public:
  // Throws kInvalidArgument unless num_nodes in [1, 64], num_ranks in [1, kMaxRanks] and
  // num_ranks % num_nodes == 0.
  Topology(int num_nodes, int num_ranks, LinkParams links = {});

  // Parses "NxM" (N nodes, M ranks per node), e.g. "4x8"; kInvalidArgument naming the valid
  // ranges otherwise (no integer overflow: N <= 64, N x M <= kMaxRanks).
  static Topology parse(const std::string& spec, LinkParams links = {});

  int num_nodes() const { return num_nodes_; }
  int num_ranks() const { return num_ranks_; }
  int ranks_per_node() const { return ranks_per_node_; }
  const LinkParams& links() const { return links_; }
  NodeId node_of(RankId rank) const { return rank / ranks_per_node_; }
  RankId first_rank_of(NodeId node) const { return node * ranks_per_node_; }
  std::string to_string() const;

  bool operator==(const Topology& other) const {
    return num_nodes_ == other.num_nodes_ && num_ranks_ == other.num_ranks_;
  }

 private:
  int num_nodes_;
  int num_ranks_;
  int ranks_per_node_;
  LinkParams links_;
};

}  // namespace cobalt
