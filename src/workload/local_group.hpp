// LocalGroup (private to the generator, synthetic.cpp): weighted draws without replacement from one
// co-activation group for one token: the group's weights [m] with the drawn members masked out
// (m <= 64), and their running total. Exact: a draw scans the members in order, so every trace is
// reproducible bit for bit from its seed.
#pragma once

#include <bit>
#include <cstdint>

#include "alias_table.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::workload {

class LocalGroup {
 public:
  // total: the group's weights summed in order from 0 (the same double every token starts from).
  LocalGroup(const AliasTable& table, double total)
      : table_(table), weights_(table.weights().data()), size_(table.size()), total_(total) {}
  // A member not drawn yet, or -1 when none is left.
  ExpertId draw(uint64_t hash) {
    if (!(total_ > 0)) return -1;
    const double target = uniform_unit(hash) * total_;
    // The first member still drawable whose running sum of drawable weights (in member order)
    // passes target; the last drawable one when rounding leaves target at or above the final sum.
    const int pick = size_ <= kBranchFreeSize ? pick_branch_free(target) : pick_scan(target);
    if (pick < 0) {
      total_ = 0;
      return -1;
    }
    remove(pick);
    return table_.items()[pick];
  }
  void remove(int slot) {
    if ((removed_ >> slot) & 1) return;  // its weight already left the total
    total_ -= weights_[slot];
    removed_ |= uint64_t{1} << slot;
  }

  static double total_of(const AliasTable& table) {
    double total = 0;
    for (double w : table.weights()) total += w;
    return total;
  }

  // pick_scan's answer for any group size (tests compare the two on random groups).
  int pick_for_test(double target, bool branch_free) const {
    return branch_free ? pick_branch_free(target) : pick_scan(target);
  }
  static constexpr int kBranchFreeSize = 16;

 private:
  bool drawable(int i) const { return weights_[i] > 0 && !((removed_ >> i) & 1); }

  // The plain scan: stops at the pick.
  int pick_scan(double target) const {
    double acc = 0;
    int pick = -1;
    for (int i = 0; i < size_; ++i) {
      if (!drawable(i)) continue;
      pick = i;
      acc += weights_[i];
      if (target < acc) break;
    }
    return pick;
  }

  // The same pick without a data-dependent branch per member (whether the scan stops at a member
  // is a coin flip, so the scan mispredicts about once per draw): every running sum is formed,
  // adding +0.0 for members that are not drawable (which leaves the sum bit for bit as the scan's),
  // and the pick is the lowest set bit of "drawable and target < sum", else the highest drawable.
  int pick_branch_free(double target) const {
    double acc = 0;
    uint64_t passes = 0, drawable_mask = 0;
    for (int i = 0; i < size_; ++i) {
      const bool ok = drawable(i);
      acc += ok ? weights_[i] : 0.0;
      drawable_mask |= static_cast<uint64_t>(ok) << i;
      passes |= static_cast<uint64_t>(ok && target < acc) << i;
    }
    if (passes != 0) return std::countr_zero(passes);
    return drawable_mask != 0 ? 63 - std::countl_zero(drawable_mask) : -1;
  }

  const AliasTable& table_;
  const double* weights_;
  int size_;
  double total_;
  uint64_t removed_ = 0;
};

}  // namespace cobalt::workload
