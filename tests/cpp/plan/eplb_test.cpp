// DeepSeek-EPLB port: the README example reproduced exactly, a hand-computed global-policy case
// (ties included), output consistency on random inputs, the heap against eplb.py's linear argmax,
// and invalid inputs.
#include "cobalt/plan/eplb.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::plan {
namespace {

std::vector<int32_t> row(const std::vector<int32_t>& v, int r, int n) {
  return std::vector<int32_t>(v.begin() + static_cast<size_t>(r) * n,
                              v.begin() + static_cast<size_t>(r + 1) * n);
}

// log2phy and logcnt agree with phy2log; replica indices 0..cnt-1 each appear once.
void expect_consistent(const EplbResult& r) {
  for (int l = 0; l < r.num_layers; ++l) {
    std::vector<int> seen(r.num_experts, 0);
    for (int p = 0; p < r.num_replicas; ++p) seen[r.phy2log_at(l, p)] += 1;
    int max_cnt = 0;
    for (int e = 0; e < r.num_experts; ++e) {
      EXPECT_EQ(seen[e], r.logcnt_at(l, e)) << "layer " << l << " expert " << e;
      EXPECT_GE(r.logcnt_at(l, e), 1);
      max_cnt = std::max(max_cnt, r.logcnt_at(l, e));
      for (int k = 0; k < r.max_replicas; ++k) {
        const int p = r.log2phy_at(l, e, k);
        if (k < r.logcnt_at(l, e)) {
          ASSERT_GE(p, 0);
          ASSERT_LT(p, r.num_replicas);
          EXPECT_EQ(r.phy2log_at(l, p), e);
          EXPECT_EQ(r.phy_rank[static_cast<size_t>(l) * r.num_replicas + p], k);
        } else {
          EXPECT_EQ(p, -1);
        }
      }
    }
    EXPECT_LE(max_cnt, r.max_replicas);
  }
}

TEST(Eplb, ReproducesReadmeExample) {
  const std::vector<double> weight = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                      20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
  const EplbResult r = rebalance_experts(weight, 2, 12, 16, 4, 2, 8);
  EXPECT_EQ(row(r.phy2log, 0, 16),
            (std::vector<int32_t>{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1}));
  EXPECT_EQ(row(r.phy2log, 1, 16),
            (std::vector<int32_t>{7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}));
  expect_consistent(r);
  // Hierarchical: each node's 8 physical experts hold the experts of its 2 groups only.
  for (int l = 0; l < 2; ++l) {
    for (int node = 0; node < 2; ++node) {
      std::vector<int> groups;
      for (int p = node * 8; p < node * 8 + 8; ++p) groups.push_back(r.phy2log_at(l, p) / 3);
      std::sort(groups.begin(), groups.end());
      groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
      EXPECT_EQ(groups.size(), 2u) << "layer " << l << " node " << node;
    }
  }
}

// Worked by hand from eplb.py: groups % nodes != 0 -> global policy. Replication adds two copies
// of expert 0 (10 -> 5 -> 3.33); packing 6 replicas onto 2 GPUs meets an exact tie (3.33 vs 3.33,
// lowest pack wins) and puts two replicas of expert 0 on GPU 0, as eplb.py does.
TEST(Eplb, GlobalPolicyHandWorkedCase) {
  const std::vector<double> weight = {10, 1, 1, 1};
  const EplbResult r = rebalance_experts(weight, 1, 4, 6, 1, 2, 2);
  EXPECT_EQ(r.phy2log, (std::vector<int32_t>{0, 0, 3, 0, 1, 2}));
  EXPECT_EQ(r.phy_rank, (std::vector<int32_t>{0, 2, 0, 1, 0, 0}));
  EXPECT_EQ(r.logcnt, (std::vector<int32_t>{3, 1, 1, 1}));
  ASSERT_EQ(r.max_replicas, 3);
  EXPECT_EQ(r.log2phy, (std::vector<int32_t>{0, 3, 1, 4, -1, -1, 5, -1, -1, 2, -1, -1}));
}

// Expected values printed by eplb.py itself (torch 1.13, CPU) on inputs full of exact ties: all
// replicas of one expert have equal loads, so the packing order is torch.sort's tie order
// (libstdc++ introsort), which the port reproduces.
TEST(Eplb, MatchesEplbPyOnExactTies) {
  {
    const std::vector<double> weight = {91743};
    const EplbResult r = rebalance_experts(weight, 1, 1, 20, 1, 1, 4);
    EXPECT_EQ(r.phy2log, std::vector<int32_t>(20, 0));
    EXPECT_EQ(r.log2phy, (std::vector<int32_t>{12, 19, 14, 9,  4,  18, 13, 8,  3,  17,
                                               0,  7,  2,  16, 11, 6,  1,  15, 10, 5}));
    EXPECT_EQ(r.logcnt, (std::vector<int32_t>{20}));
  }
  {
    const std::vector<double> weight = {3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2,
                                        5, 5, 5, 5, 0, 0, 0, 0, 4, 4, 4, 4};
    const EplbResult r = rebalance_experts(weight, 1, 24, 36, 2, 3, 6);  // 2 % 3: global
    EXPECT_EQ(r.phy2log, (std::vector<int32_t>{12, 14, 21, 2,  2, 17, 12, 13, 11, 1, 0, 16,
                                               13, 9,  20, 10, 7, 5,  14, 23, 20, 8, 6, 4,
                                               15, 22, 23, 0,  3, 19, 15, 21, 22, 1, 3, 18}));
    EXPECT_EQ(r.logcnt, (std::vector<int32_t>{2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                              2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2}));
    expect_consistent(r);
  }
}

// eplb.py's replicate_experts, literally: a linear scan for the first maximum of w / count.
ReplicateResult replicate_reference(const std::vector<float>& w, int num_log, int num_phy) {
  ReplicateResult out;
  out.phy2log.resize(num_phy);
  out.rank.assign(num_phy, 0);
  out.logcnt.assign(num_log, 1);
  for (int i = 0; i < num_log; ++i) out.phy2log[i] = i;
  for (int p = num_log; p < num_phy; ++p) {
    int best = 0;
    for (int e = 1; e < num_log; ++e) {
      if (w[e] / static_cast<float>(out.logcnt[e]) >
          w[best] / static_cast<float>(out.logcnt[best])) {
        best = e;
      }
    }
    out.phy2log[p] = best;
    out.rank[p] = out.logcnt[best];
    out.logcnt[best] += 1;
  }
  return out;
}

TEST(Eplb, ReplicateMatchesLinearArgmaxIncludingTies) {
  SplitMix64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int num_log = 1 + static_cast<int>(rng.below(40));
    const int num_phy = num_log + static_cast<int>(rng.below(60));
    std::vector<float> w(num_log);
    // Few distinct values so that ties (also between w/2 and w'/1) are common.
    for (auto& v : w) v = static_cast<float>(rng.below(4) * 6);
    const auto got = replicate_experts(w, 1, num_log, num_phy);
    const auto want = replicate_reference(w, num_log, num_phy);
    EXPECT_EQ(got.phy2log, want.phy2log) << "trial " << trial;
    EXPECT_EQ(got.rank, want.rank);
    EXPECT_EQ(got.logcnt, want.logcnt);
  }
}

TEST(Eplb, BalancedPackingFillsEveryPackExactly) {
  SplitMix64 rng(9);
  const int n = 24, packs = 4;
  std::vector<float> w(2 * n);
  for (auto& v : w) v = static_cast<float>(rng.below(100));
  const auto r = balanced_packing(w, 2, n, packs);
  for (int row = 0; row < 2; ++row) {
    std::vector<std::vector<int>> ranks(packs);
    for (int i = 0; i < n; ++i) {
      ranks[r.pack_index[row * n + i]].push_back(r.rank_in_pack[row * n + i]);
    }
    for (auto& rk : ranks) {
      std::sort(rk.begin(), rk.end());
      std::vector<int> want(n / packs);
      for (int k = 0; k < n / packs; ++k) want[k] = k;
      EXPECT_EQ(rk, want);
    }
  }
}

TEST(Eplb, RandomInputsAreConsistentAndDeterministic) {
  SplitMix64 rng(21);
  for (int trial = 0; trial < 20; ++trial) {
    const int nodes = 1 + static_cast<int>(rng.below(4));
    const int gpus = nodes * (1 + static_cast<int>(rng.below(4)));
    const int groups = nodes * (1 + static_cast<int>(rng.below(3))) + (trial % 3 == 0 ? 1 : 0);
    const int experts = groups * (1 + static_cast<int>(rng.below(6)));
    int replicas = gpus * (1 + static_cast<int>(rng.below(5)));
    while (replicas < experts) replicas += gpus;
    const int layers = 1 + static_cast<int>(rng.below(3));
    std::vector<double> weight(static_cast<size_t>(layers) * experts);
    for (auto& v : weight) v = static_cast<double>(rng.below(1000));
    const auto a = rebalance_experts(weight, layers, experts, replicas, groups, nodes, gpus);
    const auto b = rebalance_experts(weight, layers, experts, replicas, groups, nodes, gpus);
    expect_consistent(a);
    EXPECT_EQ(a.phy2log, b.phy2log);
    EXPECT_EQ(a.log2phy, b.log2phy);
  }
}

void expect_invalid(const std::vector<double>& weight, int layers, int experts, int replicas,
                    int groups, int nodes, int gpus, const std::string& fragment) {
  try {
    rebalance_experts(weight, layers, experts, replicas, groups, nodes, gpus);
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one-line message: " << msg;
  }
}

TEST(Eplb, InvalidInputsThrowClearErrors) {
  const std::vector<double> w(12, 1.0);
  expect_invalid(w, 1, 12, 18, 4, 2, 8, "replicas (18) must be a multiple of gpus (8)");
  expect_invalid(w, 1, 12, 16, 4, 3, 8, "gpus (8) must be a multiple of nodes (3)");
  expect_invalid(w, 1, 12, 8, 4, 2, 8, "replicas (8) must be >= the number of experts (12)");
  expect_invalid(w, 1, 12, 16, 8, 2, 8, "experts (12) must be a multiple of groups (8)");
  expect_invalid(w, 1, 12, 16, 0, 2, 8, "must be >= 1");
  expect_invalid(w, 2, 12, 16, 4, 2, 8, "expected 2 layers x 12 experts");
  std::vector<double> bad = w;
  bad[5] = -1;
  expect_invalid(bad, 1, 12, 16, 4, 2, 8, "weight[0][5] = -1");
  bad = w;
  bad[7] = 1e300;  // finite in double, inf in eplb.py's float32
  expect_invalid(bad, 1, 12, 16, 4, 2, 8, "weight[0][7] = 1e+300 must be finite in float32");
}

}  // namespace
}  // namespace cobalt::plan
