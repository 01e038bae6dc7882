// The paper's node-mask enumeration (Algorithm 1, step 1) as bitset algebra for N <= 8 nodes.
//
// The 2^N node masks are renumbered by (popcount, value): position j stands for the j-th mask in
// that order, so the first feasible mask of the enumeration is the lowest set position of a
// bitset of at most four 64-bit words. For a token with source node s:
//
//   feasible = without_node(s) AND (for every expert k not on s) hits(node_mask[k])
//   minimum  = feasible AND popcount_class(popcount of the mask at its lowest set position)
//   cover    = mask_at(the r-th set position of minimum), r = uniform_below(h, |minimum|)
//
// hits(m) holds the masks that meet node set m; mask 0 meets nothing, so it survives only when
// every expert is local (cover 0), the single-node masks come next in node order, then the
// pairs, and so on: the lowest set position has the fewest nodes, and `minimum` holds every
// feasible mask of that size in value order, exactly the list the reference enumeration draws
// from (node_cover.hpp). The draw's hash h = cover_hash_from_token(token hash) is only computed
// when more than one cover ties. A local expert contributes an all-ones word.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cobalt/core/rng.hpp"

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

  // [num_words] positions of the masks with `popcount` nodes, 0 <= popcount <= num_nodes.
  const uint64_t* popcount_class(int popcount) const {
    return classes_.data() + static_cast<size_t>(popcount) * num_words_;
  }

  // Algorithm 1's cover for a token whose experts have node masks `masks` [num_masks], whose source
  // node is `src_node` and whose hash is `token_h` (token_hash in rng.hpp): the feasible remote
  // mask with the fewest nodes, drawn uniformly among those that tie (in value order, by
  // uniform_below(cover_hash_from_token(token_h), count)); 0 when every expert is on the source
  // node. kWords must equal num_words().
  template <int kWords>
  uint64_t drawn_cover(const uint64_t* masks, int num_masks, int src_node, uint64_t token_h) const {
    std::array<uint64_t, kWords> feasible;
    const uint64_t* base = without_node(src_node);
    for (int w = 0; w < kWords; ++w) feasible[w] = base[w];
    for (int k = 0; k < num_masks; ++k) {
      const uint64_t local = uint64_t{0} - ((masks[k] >> src_node) & 1);  // all ones when local
      const uint64_t* h = hits(masks[k]);
      for (int w = 0; w < kWords; ++w) feasible[w] &= h[w] | local;
    }
    // Never empty: the mask of every remote node meets every expert not on the source node.
    int first_word = 0;
    while (first_word + 1 < kWords && feasible[first_word] == 0) ++first_word;
    const uint64_t first = mask_at(first_word * 64 + std::countr_zero(feasible[first_word]));
    const uint64_t* same_size = popcount_class(std::popcount(first));
    uint32_t count = 0;
    for (int w = first_word; w < kWords; ++w) {
      feasible[w] &= same_size[w];
      count += static_cast<uint32_t>(std::popcount(feasible[w]));
    }
    // Drawn even when count == 1 (uniform_below(h, 1) == 0): a branch there mispredicts on the
    // 20-34% of remote tokens whose minimum cover ties.
    uint32_t r = uniform_below(cover_hash_from_token(token_h), count);
    for (int w = first_word;; ++w) {
      const uint32_t in_word = static_cast<uint32_t>(std::popcount(feasible[w]));
      if (r < in_word) {
        uint64_t bits = feasible[w];
        for (; r > 0; --r) bits &= bits - 1;
        return mask_at(w * 64 + std::countr_zero(bits));
      }
      r -= in_word;
    }
  }

  // drawn_cover for the table's own word count.
  uint64_t drawn_cover(const uint64_t* masks, int num_masks, int src_node, uint64_t token_h) const {
    switch (num_words_) {
      case 1:
        return drawn_cover<1>(masks, num_masks, src_node, token_h);
      case 2:
        return drawn_cover<2>(masks, num_masks, src_node, token_h);
      default:
        return drawn_cover<4>(masks, num_masks, src_node, token_h);
    }
  }

 private:
  int num_nodes_;
  int num_words_;
  std::vector<uint64_t> order_;         // [2^N] masks in (popcount, value) order
  std::vector<uint64_t> hits_;          // [2^N, words]
  std::vector<uint64_t> without_node_;  // [N, words]
  std::vector<uint64_t> classes_;       // [N + 1, words] positions by popcount
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
