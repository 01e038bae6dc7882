#include "cobalt/core/memory.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cobalt/core/error.hpp"
#include "testing/scoped_memory_limit.hpp"

namespace cobalt {
namespace {

using ScopedLimit = testing::ScopedMemoryLimit;

TEST(Memory, RefusesMoreThanTheMachineHas) {
  const ScopedLimit unset(nullptr);
  ASSERT_GT(physical_memory_bytes(), 0.0);
  EXPECT_NO_THROW(require_memory(1024.0, "a small table"));
  try {
    require_memory(4.0 * physical_memory_bytes(), "a huge table");
    FAIL() << "accepted four times the machine's memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    const std::string message = e.what();
    EXPECT_NE(message.find("a huge table needs"), std::string::npos) << message;
    EXPECT_NE(message.find("GiB of memory"), std::string::npos) << message;
  }
}

// The default budget is 75% of the machine: 90% of it is refused, naming the budget and the hint.
TEST(Memory, BudgetIsAShareOfTheMachine) {
  const ScopedLimit unset(nullptr);
  EXPECT_DOUBLE_EQ(memory_budget_bytes(), kMemoryBudgetShare * physical_memory_bytes());
  try {
    require_memory(0.9 * physical_memory_bytes(), "most of the machine", "lower --layers");
    FAIL();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("above the memory budget of"), std::string::npos) << message;
    EXPECT_NE(message.find("75% of this machine's"), std::string::npos) << message;
    EXPECT_NE(message.find("; lower --layers"), std::string::npos) << message;
  }
}

TEST(Memory, LimitFromTheEnvironment) {
  {
    const ScopedLimit limit("512M");
    EXPECT_DOUBLE_EQ(memory_budget_bytes(), 512.0 * 1024 * 1024);
    EXPECT_NO_THROW(require_memory(500.0 * 1024 * 1024, "x"));
    try {
      require_memory(600.0 * 1024 * 1024, "the run");
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "the run needs 600 MiB, above the memory budget of 512 MiB (COBALT_MEMORY_LIMIT)");
    }
  }
  {
    const ScopedLimit limit("2.5G");
    EXPECT_DOUBLE_EQ(memory_budget_bytes(), 2.5 * 1024 * 1024 * 1024);
  }
  {
    const ScopedLimit limit("4096");
    EXPECT_DOUBLE_EQ(memory_budget_bytes(), 4096.0);
  }
  // Below 1 KiB is no budget (0.5 was reported as "a budget of 1 KiB").
  // Blanks on either side are refused alike (" 1G" was read as 1G, "1G " refused).
  for (const char* bad : {"lots", "-1G", "0", "12Q", "1e30", "0.5", "1000", "0.5K", " 1G", "1G "}) {
    const ScopedLimit limit(bad);
    try {
      memory_budget_bytes();
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("COBALT_MEMORY_LIMIT"), std::string::npos) << bad;
    }
  }
}

TEST(Memory, FormatsBytes) {
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.5 GiB");
  EXPECT_EQ(format_bytes(640.0 * 1024 * 1024), "640 MiB");
  EXPECT_EQ(format_bytes(1000.0), "1 KiB");
}

}  // namespace
}  // namespace cobalt
