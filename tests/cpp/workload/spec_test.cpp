// WorkloadSpec validation (one test per field: the message names the field and its range) and the
// preset registry (names, overrides, unknown names).
#include "cobalt/workload/spec.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "cobalt/core/error.hpp"
#include "cobalt/workload/presets.hpp"

namespace cobalt::workload {
namespace {

// Expects validate() to throw kInvalidArgument with every fragment in its message.
void expect_invalid(const WorkloadSpec& spec, std::initializer_list<std::string> fragments) {
  try {
    validate(spec);
    FAIL() << "expected an error containing " << *fragments.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    for (const auto& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what() << " lacks " << f;
    }
  }
}

WorkloadSpec with(const std::function<void(WorkloadSpec&)>& edit) {
  WorkloadSpec spec;
  edit(spec);
  return spec;
}

TEST(WorkloadSpec, DefaultIsValid) { EXPECT_NO_THROW(validate(WorkloadSpec{})); }

TEST(WorkloadSpec, RejectsBadShape) {
  expect_invalid(with([](auto& s) { s.num_experts = 1; }), {"num_experts = 1", "[2, 65536]"});
  expect_invalid(with([](auto& s) { s.top_k = 0; }), {"top_k = 0", "[1, 64]"});
  expect_invalid(with([](auto& s) {
                   s.num_experts = 4;
                   s.top_k = 5;
                   s.group_size = 2;
                 }),
                 {"top_k = 5", "[1, 4]"});
  expect_invalid(with([](auto& s) { s.num_layers = 0; }), {"num_layers = 0", "[1, 4096]"});
  expect_invalid(with([](auto& s) { s.num_steps = -3; }), {"num_steps = -3", "[1, 1000000]"});
  expect_invalid(with([](auto& s) { s.tokens_per_step = 0; }), {"tokens_per_step = 0", "2^31"});
  expect_invalid(with([](auto& s) { s.num_sources = 0; }), {"num_sources = 0", "[1, 65536]"});
  expect_invalid(with([](auto& s) {
                   s.num_layers = 64;
                   s.num_steps = 1000;
                   s.tokens_per_step = 1 << 20;
                 }),
                 {"exceeds the limit 2^32"});
}

TEST(WorkloadSpec, RejectsBadKnobs) {
  expect_invalid(with([](auto& s) { s.zipf_exponent = -0.1; }), {"zipf_exponent", "[0, 4]"});
  expect_invalid(with([](auto& s) { s.zipf_exponent = std::numeric_limits<double>::quiet_NaN(); }),
                 {"zipf_exponent", "[0, 4]"});
  expect_invalid(with([](auto& s) { s.layer_skew_spread = 1.0; }), {"layer_skew_spread", "[0, 1)"});
  expect_invalid(with([](auto& s) { s.popularity_order = static_cast<PopularityOrder>(7); }),
                 {"popularity_order = 7"});
  expect_invalid(with([](auto& s) { s.hot_churn = 1.5; }), {"hot_churn = 1.5", "[0, 1]"});
  expect_invalid(with([](auto& s) { s.hot_count = 65; }), {"hot_count = 65", "[1, 64]"});
  expect_invalid(with([](auto& s) { s.hot_count = 0; }), {"hot_count = 0", "[1, 64]"});
  expect_invalid(with([](auto& s) { s.group_size = 0; }), {"group_size = 0", "[1, 64]"});
  expect_invalid(with([](auto& s) { s.group_mixing = -1; }), {"group_mixing = -1", "[0, 1]"});
  expect_invalid(with([](auto& s) { s.group_affinity = 2; }), {"group_affinity = 2", "[0, 1]"});
  expect_invalid(with([](auto& s) { s.final_group_affinity = 1.2; }),
                 {"final_group_affinity = 1.2", "[0, 1]"});
  expect_invalid(with([](auto& s) { s.group_churn = -0.5; }), {"group_churn = -0.5", "[0, 1]"});
  expect_invalid(with([](auto& s) { s.domain_locality = 1.01; }),
                 {"domain_locality = 1.01", "[0, 1]"});
}

TEST(WorkloadSpec, DomainsBoundedBySourcesAndGroups) {
  // 64 experts in groups of 8 = 8 groups; 8 sources.
  expect_invalid(with([](auto& s) { s.num_domains = 9; }), {"num_domains = 9", "[1, 8]"});
  expect_invalid(with([](auto& s) {
                   s.num_sources = 3;
                   s.num_domains = 4;
                 }),
                 {"num_domains = 4", "[1, 3]", "num_sources = 3"});
  expect_invalid(with([](auto& s) {
                   s.group_size = 32;
                   s.num_domains = 3;
                 }),
                 {"num_domains = 3", "[1, 2]", "number of groups = 2"});
  EXPECT_NO_THROW(validate(with([](auto& s) { s.num_domains = 8; })));
}

TEST(WorkloadSpec, AffinityRamp) {
  WorkloadSpec spec;
  spec.num_steps = 5;
  spec.group_affinity = 0.2;
  EXPECT_DOUBLE_EQ(spec.affinity_at(4), 0.2);  // constant by default
  spec.final_group_affinity = 0.6;
  EXPECT_DOUBLE_EQ(spec.affinity_at(0), 0.2);
  EXPECT_DOUBLE_EQ(spec.affinity_at(2), 0.4);
  EXPECT_DOUBLE_EQ(spec.affinity_at(4), 0.6);
  spec.num_steps = 1;
  EXPECT_DOUBLE_EQ(spec.affinity_at(0), 0.2);
}

TEST(WorkloadPresets, ListsEveryPresetAndEachIsValid) {
  const auto presets = list_workload_presets();
  std::vector<std::string> names;
  for (const auto& p : presets) {
    names.push_back(p.name);
    EXPECT_FALSE(p.description.empty()) << p.name;
    const WorkloadSpec spec = workload_preset(p.name);
    EXPECT_EQ(spec.name, p.name);
    EXPECT_NO_THROW(validate(spec));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"uniform", "skewed", "coactivated-early",
                                             "coactivated-late", "realistic", "paper-glm45air-ep32",
                                             "paper-topoep-640x8", "scale-1024"}));
}

TEST(WorkloadPresets, PaperPresetsHaveThePaperShapes) {
  const auto glm = workload_preset("paper-glm45air-ep32");
  EXPECT_EQ(glm.num_experts, 128);
  EXPECT_EQ(glm.top_k, 8);
  EXPECT_EQ(glm.num_sources, 32);
  EXPECT_EQ(glm.tokens_per_step % (32 * 8192), 0);  // whole 8192-token sequences per source
  EXPECT_GT(glm.group_affinity, workload_preset("coactivated-early").group_affinity);
  const auto topoep = workload_preset("paper-topoep-640x8");
  EXPECT_EQ(topoep.num_experts, 640);
  EXPECT_EQ(topoep.top_k, 8);
  EXPECT_EQ(topoep.num_sources, 32);
  EXPECT_EQ(topoep.popularity_order, PopularityOrder::kById);
}

TEST(WorkloadPresets, AppliesOverrides) {
  PresetOverrides o;
  o.num_steps = 3;
  o.tokens_per_step = 1000;
  o.num_layers = 5;
  o.num_sources = 2;  // fewer than the preset's 4 domains: domains follow
  o.seed = 99;
  const auto spec = workload_preset("coactivated-early", o);
  EXPECT_EQ(spec.num_steps, 3);
  EXPECT_EQ(spec.tokens_per_step, 1000);
  EXPECT_EQ(spec.num_layers, 5);
  EXPECT_EQ(spec.num_sources, 2);
  EXPECT_EQ(spec.num_domains, 2);
  EXPECT_EQ(spec.seed, 99u);
  const auto base = workload_preset("coactivated-early");
  EXPECT_EQ(spec.group_affinity, base.group_affinity);
  EXPECT_EQ(spec.zipf_exponent, base.zipf_exponent);
}

TEST(WorkloadPresets, RejectsBadOverrideNamingTheField) {
  PresetOverrides o;
  o.num_steps = 0;
  try {
    workload_preset("skewed", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_steps = 0"), std::string::npos) << e.what();
  }
}

TEST(WorkloadPresets, UnknownNameListsValidNames) {
  try {
    workload_preset("nope");
    FAIL();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("unknown workload preset 'nope'"), std::string::npos) << message;
    for (const auto& p : list_workload_presets()) {
      EXPECT_NE(message.find(p.name), std::string::npos) << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

// top_k is at most 64 (and E): with E = 128, 64 is valid and 65 is not.
TEST(WorkloadSpec, WorkloadTopKIsAtMost64) {
  WorkloadSpec spec;
  spec.num_experts = 128;
  spec.tokens_per_step = 16;
  spec.num_steps = 1;
  spec.num_layers = 1;
  spec.top_k = 64;
  EXPECT_NO_THROW(validate(spec));
  spec.top_k = 65;
  EXPECT_THROW(validate(spec), Error);
}

}  // namespace
}  // namespace cobalt::workload
