// The paper's node-mask enumeration (Algorithm 1, step 1) as bitset algebra for N <= 8 nodes.
//
// The 2^N node masks are renumbered by (popcount, value): position j stands for the j-th mask in
// that order, so the first feasible mask of the enumeration is the lowest set position of a
// bitset of at most four 64-bit words. For a token with source node s:
//
//   feasible = without_node(s) AND (for every expert k not on s) hits(node_mask[k])
//   cover    = mask_at(lowest set position of feasible)
//
// hits(m) holds the masks that meet node set m; mask 0 meets nothing, so it survives only when
// every expert is local (cover 0), the single-node masks come next in node order (the lowest node
// holding every uncovered expert), then the pairs, and so on: exactly the mask with the fewest
// nodes, first in value order, that the reference enumeration keeps. Branch-free: a local expert
// contributes an all-ones word (`local_or_hits`).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cobalt::assign::detail {

class OrderedMaskTable {
 public:
  static constexpr int kMaxNodes = 8;
  static constexpr int kMaxWords = 4;  // 2^8 masks

  // Requires 1 <= num_nodes <= kMaxNodes.
  explicit OrderedMaskTable(int num_nodes);

  int num_nodes() const { return num_nodes_; }
  int num_words() const { return num_words_; }  // ceil(2^N / 64)

  // [num_words] positions of the masks that meet `node_mask` (any N-bit mask).
  const uint64_t* hits(uint64_t node_mask) const {
    return hits_.data() + node_mask * static_cast<uint64_t>(num_words_);
  }
  // [num_words] positions of the masks without node `node_idx`.
  const uint64_t* without_node(int node_idx) const {
    return without_node_.data() + static_cast<size_t>(node_idx) * num_words_;
  }
  // The node mask at position `position` of the (popcount, value) order.
  uint64_t mask_at(int position) const { return order_[position]; }

  // The first feasible mask for a token whose experts have node masks `masks` [num_masks] and
  // whose source node is `src_node`; kWords must equal num_words().
  template <int kWords>
  uint64_t first_cover(const uint64_t* masks, int num_masks, int src_node) const {
    std::array<uint64_t, kWords> feasible;
    const uint64_t* base = without_node(src_node);
    for (int w = 0; w < kWords; ++w) feasible[w] = base[w];
    for (int k = 0; k < num_masks; ++k) {
      const uint64_t local = uint64_t{0} - ((masks[k] >> src_node) & 1);  // all ones when local
      const uint64_t* h = hits(masks[k]);
      for (int w = 0; w < kWords; ++w) feasible[w] &= h[w] | local;
    }
    // Never empty: the mask of every remote node meets every expert not on the source node.
    int w = 0;
    while (w + 1 < kWords && feasible[w] == 0) ++w;
    return mask_at(w * 64 + std::countr_zero(feasible[w]));
  }

  // first_cover for the table's own word count.
  uint64_t first_cover(const uint64_t* masks, int num_masks, int src_node) const {
    switch (num_words_) {
      case 1:
        return first_cover<1>(masks, num_masks, src_node);
      case 2:
        return first_cover<2>(masks, num_masks, src_node);
      default:
        return first_cover<4>(masks, num_masks, src_node);
    }
  }

 private:
  int num_nodes_;
  int num_words_;
  std::vector<uint64_t> order_;         // [2^N] masks in (popcount, value) order
  std::vector<uint64_t> hits_;          // [2^N, words]
  std::vector<uint64_t> without_node_;  // [N, words]
};

// Position of the i-th set bit (0-based) of every byte: [256][8], for option masks over N <= 8
// nodes (entries past the byte's popcount are 0).
class SelectTable {
 public:
  SelectTable();
  int nth_set_bit(uint64_t byte_mask, uint32_t i) const { return table_[byte_mask * 8 + i]; }

 private:
  std::array<uint8_t, 256 * 8> table_;
};

}  // namespace cobalt::assign::detail
