// `cobalt eplb`: DeepSeek-EPLB's rebalance_experts on loads from a JSON file; prints phy2log,
// log2phy and logcnt as JSON with eplb.py's shapes and semantics.
//   FILE: [[load of expert 0, load of expert 1, ...], ...] (one row per layer)
//   exit 2: option values that cannot work together (replicas % gpus, gpus % nodes, sizes < 1);
//   exit 1: an unreadable or malformed file, or loads that do not fit the options (replicas <
//           experts, experts % groups under the hierarchical policy).
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/plan/eplb.hpp"
#include "commands.hpp"

namespace cobalt::cli {
namespace {

struct EplbArgs {
  std::string weights_path;
  int replicas = 0, groups = 0, nodes = 0, gpus = 0;
};

struct Weights {
  int num_layers = 0, num_experts = 0;
  std::vector<double> values;  // [L, E]
};

Weights read_weights(const std::string& path) {
  std::ifstream in(path);
  COBALT_CHECK_ARG(static_cast<bool>(in), "cannot open weights file '{}'", path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, "weights file '{}' is not valid JSON: {}", path, e.what());
  }
  COBALT_CHECK_ARG(doc.is_array() && !doc.empty(),
                   "weights file '{}' must hold a non-empty array of rows [layers][experts]", path);
  Weights w;
  w.num_layers = static_cast<int>(doc.size());
  for (size_t l = 0; l < doc.size(); ++l) {
    const auto& row = doc[l];
    COBALT_CHECK_ARG(row.is_array() && !row.empty(),
                     "weights file '{}': row {} must be a non-empty array of loads", path, l);
    if (l == 0) w.num_experts = static_cast<int>(row.size());
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
  if (args.gpus > kMaxRanks || args.replicas / args.gpus > kMaxExperts) {
    throw UsageError(fmt::format("--gpus {} out of range [1, {}] or --replicas {} above {} per GPU",
                                 args.gpus, kMaxRanks, args.replicas, kMaxExperts));
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
  const plan::EplbResult r = plan::rebalance_experts(
      w.values, w.num_layers, w.num_experts, args.replicas, args.groups, args.nodes, args.gpus);
  nlohmann::json phy2log = nlohmann::json::array(), log2phy = nlohmann::json::array(),
                 logcnt = nlohmann::json::array();
  for (int l = 0; l < r.num_layers; ++l) {
    nlohmann::json p = nlohmann::json::array(), lp = nlohmann::json::array(),
                   c = nlohmann::json::array();
    for (int i = 0; i < r.num_replicas; ++i) p.push_back(r.phy2log_at(l, i));
    for (int e = 0; e < r.num_experts; ++e) {
      nlohmann::json ids = nlohmann::json::array();
      for (int k = 0; k < r.max_replicas; ++k) ids.push_back(r.log2phy_at(l, e, k));
      lp.push_back(std::move(ids));
      c.push_back(r.logcnt_at(l, e));
    }
    phy2log.push_back(std::move(p));
    log2phy.push_back(std::move(lp));
    logcnt.push_back(std::move(c));
  }
  nlohmann::json out;
  out["phy2log"] = std::move(phy2log);
  out["log2phy"] = std::move(log2phy);
  out["logcnt"] = std::move(logcnt);
  fmt::print("{}\n", out.dump());
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
      ->required();
  cmd->add_option("--groups", args->groups,
                  "expert groups (hierarchical policy when a multiple of --nodes)")
      ->required();
  cmd->add_option("--nodes", args->nodes, "server nodes")->required();
  cmd->add_option("--gpus", args->gpus, "GPUs (a multiple of --nodes)")->required();
  cmd->callback([args] { run_eplb(*args); });
}

}  // namespace cobalt::cli
