#include "cobalt/core/memory.hpp"

#include <gtest/gtest.h>

#include <string>

#include "cobalt/core/error.hpp"

namespace cobalt {
namespace {

TEST(Memory, RefusesMoreThanTheMachineHas) {
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

}  // namespace
}  // namespace cobalt
