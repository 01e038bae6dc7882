#include "cobalt/core/topology.hpp"

#include <charconv>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"

namespace cobalt {

Topology::Topology(int num_nodes, int num_ranks, LinkParams links)
    : num_nodes_(num_nodes), num_ranks_(num_ranks), ranks_per_node_(0), links_(links) {
  COBALT_CHECK_ARG(num_nodes >= 1 && num_nodes <= kMaxNodes,
                   "number of nodes {} out of range [1, {}]", num_nodes, kMaxNodes);
  COBALT_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxRanks,
                   "number of ranks {} out of range [1, {}]", num_ranks, kMaxRanks);
  COBALT_CHECK_ARG(num_ranks % num_nodes == 0,
                   "number of ranks {} is not divisible by the number of nodes {}", num_ranks,
                   num_nodes);
  COBALT_CHECK_ARG(links.nvlink_bytes_per_s > 0 && links.ib_bytes_per_s_per_node > 0,
                   "link bandwidths must be positive (nvlink {}, ib {})", links.nvlink_bytes_per_s,
                   links.ib_bytes_per_s_per_node);
  ranks_per_node_ = num_ranks / num_nodes;
}

Topology Topology::parse(const std::string& text, LinkParams links) {
  const auto x = text.find('x');
  const std::string spec = printable(text);  // for messages
  // A number too large for an int is out of range (named as such), not malformed.
  auto parse_int = [&](std::string_view part, const char* what, int max_value) {
    int value = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    const bool digits = !part.empty() && ptr == part.data() + part.size();
    COBALT_CHECK_ARG(!(digits && ec == std::errc::result_out_of_range),
                     "cluster '{}': {} {} out of range [1, {}]", spec, what, printable(part),
                     max_value);
    COBALT_CHECK_ARG(ec == std::errc() && digits,
                     "cluster '{}' is not of the form NxM (N nodes, M ranks per node), e.g. 4x8",
                     spec);
    return value;
  };
  COBALT_CHECK_ARG(x != std::string::npos,
                   "cluster '{}' is not of the form NxM (N nodes, M ranks per node), e.g. 4x8",
                   spec);
  const int nodes = parse_int(std::string_view(text).substr(0, x), "nodes", kMaxNodes);
  const int per_node = parse_int(std::string_view(text).substr(x + 1), "ranks per node", kMaxRanks);
  COBALT_CHECK_ARG(nodes >= 1 && nodes <= kMaxNodes, "cluster '{}': nodes {} out of range [1, {}]",
                   spec, nodes, kMaxNodes);
  COBALT_CHECK_ARG(per_node >= 1 && per_node <= kMaxRanks / nodes,
                   "cluster '{}': ranks per node {} out of range [1, {}] ({} ranks at most)", spec,
                   per_node, kMaxRanks / nodes, kMaxRanks);
  return Topology(nodes, nodes * per_node, links);
}

std::string Topology::to_string() const {
  return fmt::format("{}x{}", num_nodes_, ranks_per_node_);
}

}  // namespace cobalt
