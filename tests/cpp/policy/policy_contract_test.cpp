// make_policy and Policy::run keep their header's promises at the edges: a policy that would not
// fit the memory budget is refused up front, cobalt and cobalt+ refuse a top-k their assignment
// cannot take when they are made (not at every run), E out of range is named, and a refused call
// records no step.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/policy/policy.hpp"
#include "testing/policy_config.hpp"
#include "testing/random_inputs.hpp"
#include "testing/scoped_memory_limit.hpp"

namespace cobalt::policy {
namespace {

PolicyConfig config_of(int num_experts, int top_k, int num_layers, int slots_per_rank) {
  PolicyConfig config =
      testing::small_policy_config(Topology(2, 16), num_experts, top_k, slots_per_rank);
  config.num_layers = num_layers;  // 2 nodes x 8 ranks
  return config;
}

std::string message_of(const std::function<void()>& call, ErrorCode expected_code) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), expected_code) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(MakePolicy, RefusesAPolicyAboveTheMemoryBudget) {
  // 2000 layers of E = 256 statistics: ~2.5 GB (policy_memory), where the run used to find out
  // by growing past the limit (or being killed).
  const testing::ScopedMemoryLimit limit("64M");
  const PolicyConfig config = config_of(256, 8, 2000, 40);
  for (const char* name : {"cobalt", "cobalt+", "smartmoe"}) {
    const std::string message =
        message_of([&] { make_policy(name, config); }, ErrorCode::kFailedPrecondition);
    EXPECT_NE(message.find(std::string("policy '") + name + "' (2000 layers, E = 256, G = 16)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("lower the number of layers or experts"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(make_policy("cobalt", config_of(256, 8, 2, 40)));  // a few MB
}

TEST(MakePolicy, CobaltRefusesATopKItsAssignmentCannotTake) {
  const PolicyConfig config = config_of(32, 17, 1, 4);
  for (const char* name : {"cobalt", "cobalt+"}) {
    const std::string message =
        message_of([&] { make_policy(name, config); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find(std::string("policy ") + name + ": top-k 17 out of range [1, 16]"),
              std::string::npos)
        << message;
  }
  // The peers take any top-k.
  auto policy = make_policy("static", config);
  auto batch = testing::random_batch(3, 20, 17, 32, 16);
  std::vector<RankId> exec(20 * 17);
  EXPECT_NO_THROW(policy->run(0, 0, batch.view(), exec));
}

// E beyond what any layout takes is named with its range; the suggested slot range used to
// overflow ("slots per rank 0 out of range [-268435455, 2147483647]").
TEST(MakePolicy, RefusesTooManyExpertsByName) {
  PolicyConfig config = config_of(16, 2, 1, 2);
  config.num_experts = 2147483647;
  const std::string message = message_of([&] { config.validate(); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("number of experts 2147483647 out of range [1, 65536]"), std::string::npos)
      << message;
}

// A plan that throws (here EPLB's log2phy past a tiny memory budget) leaves the plan due: the
// retry of the step plans, as a twin that never failed does at that step (the failed call had
// marked the step planned, so the retry kept static EP).
TEST(PolicyRun, APlanThatThrowsIsMadeAgainByARetry) {
  PolicyConfig config = testing::small_policy_config(Topology(2, 16), 512, 2, 48);
  config.steps_per_global_plan = 1;
  auto policy = make_policy("eplb", config), twin = make_policy("eplb", config);
  const auto batch = testing::random_batch(9, 4000, 2, 512, 16, 1.0);
  std::vector<RankId> exec(8000), twin_exec(8000);
  policy->run(0, 0, batch.view(), exec);
  twin->run(0, 0, batch.view(), twin_exec);
  {
    const testing::ScopedMemoryLimit limit("1K");
    message_of([&] { policy->run(1, 0, batch.view(), exec); }, ErrorCode::kFailedPrecondition);
  }
  const auto layout = policy->run(1, 0, batch.view(), exec);
  const auto twin_layout = twin->run(1, 0, batch.view(), twin_exec);
  EXPECT_TRUE(*layout == *twin_layout);
  EXPECT_EQ(exec, twin_exec);
  EXPECT_EQ(policy->counters().num_global_plans, twin->counters().num_global_plans);
  EXPECT_GE(twin->counters().num_global_plans, 1);
}

TEST(PolicyRun, ARefusedCallRecordsNoStep) {
  // cobalt needs token ids: run_loads at step 6 is refused before anything is recorded, so
  // step 5 is still in order (the refused call used to record step 6 first).
  auto policy = make_policy("cobalt", config_of(16, 2, 1, 2));
  std::vector<int64_t> counts(16 * 16, 1), loads(16);
  message_of([&] { policy->run_loads(6, 0, counts, loads); }, ErrorCode::kFailedPrecondition);
  auto batch = testing::random_batch(5, 40, 2, 16, 16);
  std::vector<RankId> exec(80);
  EXPECT_NO_THROW(policy->run(5, 0, batch.view(), exec));
  const std::string message =
      message_of([&] { policy->run(4, 0, batch.view(), exec); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("step 4 of layer 0 after step 5"), std::string::npos) << message;
}

}  // namespace
}  // namespace cobalt::policy
