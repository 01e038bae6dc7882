#include "ordered_mask_table.hpp"

#include <algorithm>
#include <bit>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::assign::detail {

OrderedMaskTable::OrderedMaskTable(int num_nodes)
    : num_nodes_(num_nodes), num_words_(std::max(1, (1 << num_nodes) / 64)) {
  COBALT_CHECK_ARG(num_nodes >= 1 && num_nodes <= kMaxNodes,
                   "mask table: {} nodes out of range [1, {}]", num_nodes, kMaxNodes);
  const int num_masks = 1 << num_nodes;
  order_.resize(num_masks);
  std::iota(order_.begin(), order_.end(), uint64_t{0});
  std::stable_sort(order_.begin(), order_.end(),
                   [](uint64_t a, uint64_t b) { return std::popcount(a) < std::popcount(b); });
  hits_.assign(static_cast<size_t>(num_masks) * num_words_, 0);
  without_node_.assign(static_cast<size_t>(num_nodes) * num_words_, 0);
  classes_.assign(static_cast<size_t>(num_nodes + 1) * num_words_, 0);
  for (int position = 0; position < num_masks; ++position) {
    const uint64_t b = order_[position];
    const uint64_t bit = uint64_t{1} << (position % 64);
    const int word = position / 64;
    classes_[static_cast<size_t>(std::popcount(b)) * num_words_ + word] |= bit;
    for (int m = 0; m < num_masks; ++m) {
      if (b & static_cast<uint64_t>(m)) hits_[static_cast<size_t>(m) * num_words_ + word] |= bit;
    }
    for (int n = 0; n < num_nodes; ++n) {
      if (!(b & (uint64_t{1} << n)))
        without_node_[static_cast<size_t>(n) * num_words_ + word] |= bit;
    }
  }
}

SelectTable::SelectTable() : table_{} {
  for (int byte = 0; byte < 256; ++byte) {
    int i = 0;
    for (int bit = 0; bit < 8; ++bit) {
      if (byte & (1 << bit))
        table_[static_cast<size_t>(byte) * 8 + i++] = static_cast<uint8_t>(bit);
    }
  }
}

}  // namespace cobalt::assign::detail
