#include "cobalt/core/topology.hpp"

#include <gtest/gtest.h>

#include "cobalt/core/error.hpp"

namespace cobalt {
namespace {

TEST(Topology, NodeOfRank) {
  Topology topo(4, 32);
  EXPECT_EQ(topo.ranks_per_node(), 8);
  EXPECT_EQ(topo.node_of(0), 0);
  EXPECT_EQ(topo.node_of(7), 0);
  EXPECT_EQ(topo.node_of(8), 1);
  EXPECT_EQ(topo.node_of(31), 3);
  EXPECT_EQ(topo.first_rank_of(2), 16);
  EXPECT_EQ(topo.to_string(), "4x8");
}

TEST(Topology, ParseSpec) {
  Topology topo = Topology::parse("2x8");
  EXPECT_EQ(topo.num_nodes(), 2);
  EXPECT_EQ(topo.num_ranks(), 16);
  // Including sizes whose product overflows int32 (4 x 1073741826 would wrap to 8 ranks).
  for (const char* bad : {"", "2", "x8", "2x", "2x0", "0x8", "axb", "2x8x", "65x1", "4x1073741826",
                          "64x2147483647", "1x100000", "3x1431655766", "2x99999999999"}) {
    EXPECT_THROW(Topology::parse(bad), Error) << bad;
  }
}

TEST(Topology, RejectsRanksNotDivisibleByNodes) {
  try {
    Topology(3, 8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cobalt
