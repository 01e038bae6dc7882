#include "workload/local_group.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "cobalt/core/rng.hpp"

namespace cobalt::workload {
namespace {

// The branch-free pick (used for groups of up to LocalGroup::kBranchFreeSize members) against the
// plain scan: the same member for random groups of 1-64 members with zero weights, members already
// drawn (all of them in some), and targets anywhere from 0 to past the total (rounding can leave a
// target there), including targets equal to a running sum.
TEST(LocalGroup, BranchFreePickEqualsTheScan) {
  SplitMix64 rng(11);
  int checked = 0, exact_sums = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int size = 1 + static_cast<int>(rng.below(64));
    std::vector<ExpertId> items(size);
    std::vector<double> weights(size);
    for (int i = 0; i < size; ++i) {
      items[i] = i;
      weights[i] = rng.below(4) == 0 ? 0.0 : rng.unit();
    }
    AliasTable table;
    table.build(items, weights);
    LocalGroup group(table, LocalGroup::total_of(table));
    std::vector<bool> removed(size, false);
    for (int i = 0; i < size; ++i) {
      if (trial % 50 == 0 || rng.below(3) == 0) {  // every 50th: nothing drawable
        group.remove(i);
        removed[i] = true;
      }
    }
    // Running sums of the drawable weights (positive, not removed), as both picks form them.
    std::vector<double> sums;
    double acc = 0;
    for (int i = 0; i < size; ++i) {
      if (table.weights()[i] > 0 && !removed[i]) sums.push_back(acc += table.weights()[i]);
    }
    for (int probe = 0; probe < 20; ++probe) {
      double target = rng.unit() * (acc + 1e-9);
      if (probe < 3 && !sums.empty()) {
        target = sums[rng.below(sums.size())];
        ++exact_sums;
      }
      if (probe == 3) target = 0.0;
      if (probe == 4) target = acc * 2;
      ASSERT_EQ(group.pick_for_test(target, true), group.pick_for_test(target, false))
          << "trial " << trial << " size " << size << " target " << target;
      ++checked;
    }
  }
  EXPECT_GT(exact_sums, 1000);
  EXPECT_EQ(checked, 3000 * 20);
}

// Draws without replacement: every drawable member once, then -1.
TEST(LocalGroup, DrawsEachDrawableMemberOnce) {
  for (int size : {1, 5, 16, 17, 64}) {
    std::vector<ExpertId> items(size);
    std::vector<double> weights(size);
    for (int i = 0; i < size; ++i) {
      items[i] = 100 + i;
      weights[i] = i % 3 == 1 ? 0.0 : 1.0 + i;
    }
    AliasTable table;
    table.build(items, weights);
    LocalGroup group(table, LocalGroup::total_of(table));
    SplitMix64 rng(static_cast<uint64_t>(size));
    std::vector<int> seen(size, 0);
    for (;;) {
      const ExpertId e = group.draw(rng.next());
      if (e < 0) break;
      ASSERT_GE(e, 100);
      ASSERT_LT(e, 100 + size);
      ++seen[e - 100];
    }
    for (int i = 0; i < size; ++i) EXPECT_EQ(seen[i], i % 3 == 1 ? 0 : 1) << size << " " << i;
  }
}

}  // namespace
}  // namespace cobalt::workload
