// `cobalt eplb`: DeepSeek-EPLB's rebalance_experts on loads from a JSON file; prints phy2log,
// log2phy and logcnt as JSON with eplb.py's shapes and semantics.
//   FILE: [[load of expert 0, load of expert 1, ...], ...] (one row per layer)
//   exit 2: option values that cannot work together (replicas % gpus, gpus % nodes, sizes < 1);
//   exit 1: an unreadable or malformed file, or loads that do not fit the options (replicas <
//           experts, experts % groups under the hierarchical policy).
#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/plan/eplb.hpp"
#include "commands.hpp"

namespace cobalt::cli {
namespace {

struct EplbArgs {
  std::string weights_path;
  int replicas = 0, groups = 0, nodes = 0, gpus = 0;
};

// Bytes per (layer, physical expert) that rebalance_experts holds at its peak (float weights and
// int32 maps of the replication, the packing and the result, each in a few copies): measured about
// 30, rounded up.
constexpr double kEplbBytesPerReplica = 48;

struct Weights {
  int num_layers = 0, num_experts = 0;
  std::vector<double> values;  // [L, E]
};

Weights read_weights(const std::string& path) {
  std::error_code error;
  COBALT_CHECK_ARG(!std::filesystem::is_directory(path, error),
                   "weights file '{}' is a directory (give a JSON file)", path);
  std::ifstream in(path);
  COBALT_CHECK_IO(static_cast<bool>(in), "cannot open weights file '{}': {}", path,
                  std::strerror(errno));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "weights file '{}': {}", printable(path, 200),
         json_problem(e.id, e.what()));
  } catch (const std::exception& e) {  // a read error (std::ios_base::failure)
    fail_io("cannot read weights file '{}': {}", path, e.what());
  }
  COBALT_CHECK_ARG(doc.is_array() && !doc.empty(),
                   "weights file '{}' must hold a non-empty array of rows [layers][experts]", path);
  Weights w;
  w.num_layers = static_cast<int>(doc.size());
  for (size_t l = 0; l < doc.size(); ++l) {
    const auto& row = doc[l];
    COBALT_CHECK_ARG(row.is_array() && !row.empty(),
                     "weights file '{}': row {} must be a non-empty array of loads", path, l);
    if (l == 0) {
      COBALT_CHECK_ARG(row.size() >= 1 && row.size() <= static_cast<size_t>(kMaxExperts),
                       "weights file '{}': {} experts per layer, out of range [1, {}]", path,
                       row.size(), kMaxExperts);
      w.num_experts = static_cast<int>(row.size());
    }
    COBALT_CHECK_ARG(static_cast<int>(row.size()) == w.num_experts,
                     "weights file '{}': row {} has {} loads, row 0 has {}", path, l, row.size(),
                     w.num_experts);
    for (size_t e = 0; e < row.size(); ++e) {
      COBALT_CHECK_ARG(row[e].is_number(), "weights file '{}': [{}][{}] is not a number", path, l,
                       e);
      w.values.push_back(row[e].get<double>());
    }
  }
  return w;
}

void run_eplb(const EplbArgs& args) {
  if (args.replicas < 1 || args.groups < 1 || args.nodes < 1 || args.gpus < 1) {
    throw UsageError("--replicas, --groups, --nodes and --gpus must all be >= 1");
  }
  if (args.gpus > kMaxRanks) {
    throw UsageError(fmt::format("--gpus {} out of range [1, {}]", args.gpus, kMaxRanks));
  }
  if (args.replicas / args.gpus > kMaxExperts) {
    throw UsageError(
        fmt::format("--replicas {} on --gpus {}: {} replicas per GPU, out of range "
                    "[1, {}]",
                    args.replicas, args.gpus, args.replicas / args.gpus, kMaxExperts));
  }
  if (args.gpus % args.nodes != 0) {
    throw UsageError(
        fmt::format("--gpus ({}) must be a multiple of --nodes ({})", args.gpus, args.nodes));
  }
  if (args.replicas % args.gpus != 0) {
    throw UsageError(
        fmt::format("--replicas ({}) must be a multiple of --gpus ({})", args.replicas, args.gpus));
  }
  const Weights w = read_weights(args.weights_path);
  // The assignment's arrays grow with layers x replicas (the output's log2phy with layers x
  // experts x the most replicas of one expert, which rebalance_experts checks once it knows it).
  require_memory(kEplbBytesPerReplica * w.num_layers * static_cast<double>(args.replicas),
                 fmt::format("eplb: {} layers x {} replicas", w.num_layers, args.replicas),
                 "lower --replicas, or give a weights file of fewer layers");
  const plan::EplbResult r = plan::rebalance_experts(
      w.values, w.num_layers, w.num_experts, args.replicas, args.groups, args.nodes, args.gpus);
  // Written as it is formatted (the same text as nlohmann's compact dump), not built as a JSON
  // document first: that took ~40 bytes per number on top of the result.
  std::string line;
  auto flush = [&] {
    std::fwrite(line.data(), 1, line.size(), stdout);
    line.clear();
  };
  line += "{\"log2phy\":[";
  for (int l = 0; l < r.num_layers; ++l) {
    line += l ? ",[" : "[";
    for (int e = 0; e < r.num_experts; ++e) {
      line += e ? ",[" : "[";
      for (int k = 0; k < r.max_replicas; ++k) {
        fmt::format_to(std::back_inserter(line), "{}{}", k ? "," : "", r.log2phy_at(l, e, k));
      }
      line += "]";
      if (line.size() > (1 << 20)) flush();
    }
    line += "]";
  }
  line += "],\"logcnt\":[";
  for (int l = 0; l < r.num_layers; ++l) {
    line += l ? ",[" : "[";
    for (int e = 0; e < r.num_experts; ++e) {
      fmt::format_to(std::back_inserter(line), "{}{}", e ? "," : "", r.logcnt_at(l, e));
    }
    line += "]";
    if (line.size() > (1 << 20)) flush();
  }
  line += "],\"phy2log\":[";
  for (int l = 0; l < r.num_layers; ++l) {
    line += l ? ",[" : "[";
    for (int i = 0; i < r.num_replicas; ++i) {
      fmt::format_to(std::back_inserter(line), "{}{}", i ? "," : "", r.phy2log_at(l, i));
      if (line.size() > (1 << 20)) flush();
    }
    line += "]";
  }
  line += "]}\n";
  flush();
}

}  // namespace

void register_eplb_command(CLI::App& app) {
  auto args = std::make_shared<EplbArgs>();
  auto* cmd = app.add_subcommand(
      "eplb", "DeepSeek-EPLB rebalance_experts: prints phy2log, log2phy and logcnt as JSON");
  cmd->add_option("--weights", args->weights_path, "JSON file of loads [layers][experts]")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--replicas", args->replicas, "physical experts (a multiple of --gpus)")
      ->required()
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--groups", args->groups,
                  "expert groups (hierarchical policy when a multiple of --nodes)")
      ->required()
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--nodes", args->nodes, "server nodes")
      ->required()
      ->transform(integer_in(1, kMaxInt));
  cmd->add_option("--gpus", args->gpus, "GPUs (a multiple of --nodes)")
      ->required()
      ->transform(integer_in(1, kMaxRanks));
  cmd->callback([args] { run_eplb(*args); });
}

}  // namespace cobalt::cli
