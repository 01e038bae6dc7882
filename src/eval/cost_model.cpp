#include "cobalt/eval/cost_model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"

namespace cobalt::eval {

namespace {

// Achievable share of the dense BF16 peak for the grouped expert GEMMs of a training step (an
// assumption, stated as one: MoE training reports 35-55% model FLOPs utilisation; expert GEMMs
// with a few thousand rows per expert sit near the middle).
constexpr double kAchievableFraction = 0.5;

std::vector<ClusterPreset> make_cluster_presets() {
  return {
      // NVIDIA HGX B200: NVLink 5 at 1.8 TB/s bidirectional per GPU = 900 GB/s one way; 8 x
      // ConnectX-7 400 Gb/s = 400 GB/s per node (the Cobalt paper's testbed: 4 B200 servers,
      // 1.8 TB/s NVLink, 400 GB/s InfiniBand). Dense BF16 peak 2.25 PFLOP/s per GPU (HGX B200
      // datasheet, without sparsity).
      {"4x8-b200", 4, 8, 900e9, 400e9, 2.25e15, kAchievableFraction,
       "HGX B200: NVLink 900 GB/s per GPU one way, IB 400 GB/s per node, 2.25 PFLOP/s dense BF16"},
      // NVIDIA H800 SXM: NVLink 400 GB/s bidirectional per GPU = 200 GB/s one way; 8 x 400 Gb/s
      // (50 GB/s) NICs per node (DeepSeek-V3 report, §3.2.2); dense BF16 peak 989 TFLOP/s (same
      // tensor cores as H100 SXM).
      {"4x8-h800", 4, 8, 200e9, 8 * 50e9, 989e12, kAchievableFraction,
       "H800 SXM: NVLink 200 GB/s per GPU one way, IB 8 x 50 GB/s per node, 989 TFLOP/s dense "
       "BF16"},
  };
}

std::vector<ModelPreset> make_model_presets() {
  // Numbers from each model's public Hugging Face config.json (routed experts only; shared experts
  // run on every rank for every token and do not depend on the layout). MoE layers =
  // num_hidden_layers - first_k_dense_replace where the config has it. bytes_per_element = 2:
  // BF16 training (torch_dtype bfloat16 in every config).
  return {
      // zai-org/GLM-4.5-Air: hidden_size 4096, moe_intermediate_size 1408, n_routed_experts 128,
      // num_experts_per_tok 8, num_hidden_layers 46, first_k_dense_replace 1.
      {"glm-4.5-air", 4096, 1408, 128, 8, 45, 2,
       "huggingface.co/zai-org/GLM-4.5-Air/blob/main/config.json"},
      // deepseek-ai/DeepSeek-V3: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts
      // 256, num_experts_per_tok 8, num_hidden_layers 61, first_k_dense_replace 3. (DeepSeek
      // dispatches in FP8; BF16 here like the other presets.)
      {"deepseek-v3", 7168, 2048, 256, 8, 58, 2,
       "huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json"},
      // Qwen/Qwen3-30B-A3B: hidden_size 2048, moe_intermediate_size 768, num_experts 128,
      // num_experts_per_tok 8, num_hidden_layers 48, decoder_sparse_step 1 (every layer MoE).
      {"qwen3-30b-a3b", 2048, 768, 128, 8, 48, 2,
       "huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json"},
      // deepseek-ai/DeepSeek-V2: hidden_size 5120, moe_intermediate_size 1536, n_routed_experts
      // 160, num_experts_per_tok 6, num_hidden_layers 60, first_k_dense_replace 1.
      {"deepseek-v2", 5120, 1536, 160, 6, 59, 2,
       "huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json"},
      // deepseek-ai/DeepSeek-V2-Lite: hidden_size 2048, moe_intermediate_size 1408,
      // n_routed_experts 64, num_experts_per_tok 6, num_hidden_layers 27, first_k_dense_replace 1.
      {"deepseek-v2-lite", 2048, 1408, 64, 6, 26, 2,
       "huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json"},
      // allenai/OLMoE-1B-7B-0924: hidden_size 2048, intermediate_size 1024 (per expert),
      // num_experts 64, num_experts_per_tok 8, num_hidden_layers 16 (every layer MoE).
      {"olmoe-1b-7b", 2048, 1024, 64, 8, 16, 2,
       "huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json"},
      // Qwen/Qwen1.5-MoE-A2.7B: hidden_size 2048, moe_intermediate_size 1408, num_experts 60,
      // num_experts_per_tok 4, num_hidden_layers 24 (every layer MoE).
      {"qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 24, 2,
       "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json"},
  };
}

// Lower-case letters and digits only: "Qwen1.5-MoE-A2.7B" -> "qwen15moea27b".
std::string normalise(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return out;
}

template <typename T>
std::string names_of(const std::vector<T>& items) {
  std::vector<std::string> names;
  for (const auto& item : items) names.push_back(item.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

void add_transfer(LinkBytes& bytes, const Topology& topology, RankId from, RankId to,
                  double amount) {
  if (from == to || amount <= 0) return;
  const NodeId from_node = topology.node_of(from), to_node = topology.node_of(to);
  if (from_node != to_node) {
    bytes.node_out[from_node] += amount;
    bytes.node_in[to_node] += amount;
  } else {
    bytes.rank_out[from] += amount;
    bytes.rank_in[to] += amount;
  }
}

}  // namespace

Topology ClusterPreset::topology() const {
  return Topology(num_nodes, num_nodes * ranks_per_node,
                  LinkParams{nvlink_bytes_per_s, ib_bytes_per_s_per_node});
}

const std::vector<ClusterPreset>& cluster_presets() {
  static const std::vector<ClusterPreset> presets = make_cluster_presets();
  return presets;
}

const ClusterPreset& cluster_preset(std::string_view name) {
  for (const auto& p : cluster_presets()) {
    if (p.name == name) return p;
  }
  fail(ErrorCode::kInvalidArgument, "unknown cluster preset '{}' (valid: {})", printable(name),
       names_of(cluster_presets()));
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = make_model_presets();
  return presets;
}

const ModelPreset& model_preset(std::string_view name) {
  for (const auto& p : model_presets()) {
    if (p.name == name) return p;
  }
  fail(ErrorCode::kInvalidArgument, "unknown model '{}' (valid: {})", printable(name),
       names_of(model_presets()));
}

std::optional<std::string> guess_model_preset(std::string_view model_metadata, int num_experts,
                                              int top_k) {
  const std::string wanted = normalise(model_metadata);
  if (!wanted.empty()) {
    // The most specific name wins ("DeepSeek-V2-Lite" contains both deepseek-v2 and
    // deepseek-v2-lite).
    const ModelPreset* best = nullptr;
    for (const auto& p : model_presets()) {
      if (wanted.find(normalise(p.name)) != std::string::npos &&
          (best == nullptr || normalise(p.name).size() > normalise(best->name).size())) {
        best = &p;
      }
    }
    if (best != nullptr) return best->name;
  }
  for (const auto& p : model_presets()) {
    if (p.num_experts == num_experts && p.top_k == top_k) return p.name;
  }
  return std::nullopt;
}

void CostParams::validate() const {
  // Every rate, size and factor is finite: an infinite one would make modelled times infinite
  // or zero (NaN is refused by the range checks below).
  for (const auto& [name, value] : {std::pair{"NVLink bandwidth", nvlink_bytes_per_s},
                                    std::pair{"IB bandwidth", ib_bytes_per_s_per_node},
                                    std::pair{"achievable FLOP/s", achievable_flops},
                                    std::pair{"FLOP factor", fwd_bwd_flops_factor},
                                    std::pair{"gradient bytes per element", grad_bytes_per_element},
                                    std::pair{"optimizer factor", optimizer_factor}}) {
    COBALT_CHECK_ARG(!std::isinf(value), "cost model: {} {} must be finite", name, value);
  }
  COBALT_CHECK_ARG(nvlink_bytes_per_s > 0, "cost model: NVLink bandwidth {} must be > 0",
                   nvlink_bytes_per_s);
  COBALT_CHECK_ARG(ib_bytes_per_s_per_node > 0, "cost model: IB bandwidth {} must be > 0",
                   ib_bytes_per_s_per_node);
  COBALT_CHECK_ARG(achievable_flops > 0, "cost model: achievable FLOP/s {} must be > 0",
                   achievable_flops);
  COBALT_CHECK_ARG(hidden_size >= 1 && expert_ffn_size >= 1 && bytes_per_element >= 1,
                   "cost model: hidden {} / expert FFN {} / bytes per element {} must be >= 1",
                   hidden_size, expert_ffn_size, bytes_per_element);
  COBALT_CHECK_ARG(matmuls_per_expert >= 1 && fwd_bwd_flops_factor > 0 && exchanges_per_layer >= 0,
                   "cost model: matmuls {} >= 1, FLOP factor {} > 0, exchanges {} >= 0 required",
                   matmuls_per_expert, fwd_bwd_flops_factor, exchanges_per_layer);
  COBALT_CHECK_ARG(overlap_fraction >= 0 && overlap_fraction <= 1,
                   "cost model: overlap fraction {} out of range [0, 1]", overlap_fraction);
  COBALT_CHECK_ARG(planner_overlap >= 0 && planner_overlap <= 1,
                   "cost model: planner overlap {} out of range [0, 1]", planner_overlap);
  COBALT_CHECK_ARG(grad_bytes_per_element >= 0 && optimizer_factor >= 0 && planner_time_scale >= 0,
                   "cost model: gradient bytes {}, optimizer factor {}, planner time scale {} "
                   "must be >= 0",
                   grad_bytes_per_element, optimizer_factor, planner_time_scale);
  COBALT_CHECK_ARG(planner_time_scale <= kMaxPlannerTimeScale,
                   "cost model: planner time scale {} out of range [0, {}]", planner_time_scale,
                   kMaxPlannerTimeScale);
}

CostParams make_cost_params(const ClusterPreset& cluster, const ModelPreset& model) {
  CostParams p;
  p.nvlink_bytes_per_s = cluster.nvlink_bytes_per_s;
  p.ib_bytes_per_s_per_node = cluster.ib_bytes_per_s_per_node;
  p.achievable_flops = cluster.achievable_flops_per_gpu();
  p.hidden_size = model.hidden_size;
  p.expert_ffn_size = model.expert_ffn_size;
  p.bytes_per_element = model.bytes_per_element;
  return p;
}

LinkBytes::LinkBytes(int num_nodes, int num_ranks)
    : node_out(num_nodes, 0.0),
      node_in(num_nodes, 0.0),
      rank_out(num_ranks, 0.0),
      rank_in(num_ranks, 0.0) {}

double LinkBytes::total_inter() const {
  double sum = 0;
  for (double b : node_out) sum += b;
  return sum;
}

double LinkBytes::total_intra() const {
  double sum = 0;
  for (double b : rank_out) sum += b;
  return sum;
}

LinkBytes exchange_bytes(const ExchangeVolume& volume, double token_bytes) {
  LinkBytes bytes(static_cast<int>(volume.node_out.size()),
                  static_cast<int>(volume.nvlink_out.size()));
  for (size_t n = 0; n < volume.node_out.size(); ++n) {
    bytes.node_out[n] = static_cast<double>(volume.node_out[n]) * token_bytes;
    bytes.node_in[n] = static_cast<double>(volume.node_in[n]) * token_bytes;
  }
  for (size_t r = 0; r < volume.nvlink_out.size(); ++r) {
    bytes.rank_out[r] = static_cast<double>(volume.nvlink_out[r]) * token_bytes;
    bytes.rank_in[r] = static_cast<double>(volume.nvlink_in[r]) * token_bytes;
  }
  return bytes;
}

LinkTime link_time(const LinkBytes& bytes, const CostParams& params) {
  LinkTime t;
  for (size_t n = 0; n < bytes.node_out.size(); ++n) {
    t.inter_s = std::max(
        t.inter_s, std::max(bytes.node_out[n], bytes.node_in[n]) / params.ib_bytes_per_s_per_node);
  }
  for (size_t r = 0; r < bytes.rank_out.size(); ++r) {
    t.intra_s = std::max(t.intra_s,
                         std::max(bytes.rank_out[r], bytes.rank_in[r]) / params.nvlink_bytes_per_s);
  }
  return t;
}

double compute_time(std::span<const int64_t> rank_loads, const CostParams& params) {
  int64_t max_load = 0;
  for (int64_t l : rank_loads) max_load = std::max(max_load, l);
  return static_cast<double>(max_load) * params.flops_per_task() / params.achievable_flops;
}

double layer_time(double compute_s, double exchange_s, const CostParams& params) {
  const double comm = params.exchanges_per_layer * exchange_s;
  return compute_s + comm - params.overlap_fraction * std::min(compute_s, comm);
}

std::vector<RankId> initial_main_ranks(const ExpertLayout& layout) {
  std::vector<RankId> mains(layout.num_experts());
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    const RankId home =
        static_cast<RankId>(static_cast<int64_t>(e) * layout.num_ranks() / layout.num_experts());
    mains[e] = layout.holds(home, e) ? home : layout.ranks_of(e).front();
  }
  return mains;
}

std::vector<RankId> next_main_ranks(const ExpertLayout& layout, std::span<const RankId> previous) {
  COBALT_CHECK_ARG(previous.size() == static_cast<size_t>(layout.num_experts()),
                   "cost model: {} previous main ranks for {} experts", previous.size(),
                   layout.num_experts());
  std::vector<RankId> mains(layout.num_experts());
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    const RankId old = previous[e];
    if (old >= 0 && old < layout.num_ranks() && layout.holds(old, e)) {
      mains[e] = old;
      continue;
    }
    const auto local = old >= 0 && old < layout.num_ranks()
                           ? layout.ranks_of(e, layout.topology().node_of(old))
                           : std::span<const RankId>();
    mains[e] = local.empty() ? layout.ranks_of(e).front() : local.front();
  }
  return mains;
}

namespace {

// Main ranks [num_experts], each in [0, num_ranks): the cost functions index links by them.
void check_main_ranks(std::string_view what, std::span<const RankId> mains, size_t num_experts,
                      int num_ranks) {
  COBALT_CHECK_ARG(mains.size() == num_experts, "{}: {} main ranks for {} experts", what,
                   mains.size(), num_experts);
  for (size_t e = 0; e < mains.size(); ++e) {
    COBALT_CHECK_ARG(mains[e] >= 0 && mains[e] < num_ranks,
                     "{}: main rank {} of expert {} out of range [0, {})", what, mains[e], e,
                     num_ranks);
  }
}

}  // namespace

LinkBytes grad_sync_bytes(const ExpertLayout& layout, std::span<const RankId> main_ranks,
                          const CostParams& params) {
  check_main_ranks("grad_sync_bytes", main_ranks, static_cast<size_t>(layout.num_experts()),
                   layout.num_ranks());
  const Topology& topology = layout.topology();
  LinkBytes bytes(topology);
  const double grad = params.expert_params() * params.grad_bytes_per_element;
  const double refresh = params.param_refresh ? params.expert_param_bytes() : 0.0;
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    if (layout.num_replicas_of(e) < 2) continue;
    const RankId main = main_ranks[e];
    const NodeId main_node = topology.node_of(main);
    for (NodeId n = 0; n < topology.num_nodes(); ++n) {
      const auto holders = layout.ranks_of(e, n);
      if (holders.empty()) continue;
      // Hierarchical, like the token exchange: on the main's node every replica talks to the main
      // over NVLink; elsewhere the node's replicas reduce into their lowest holder (NVLink), which
      // sends one copy to the main over the fabric (and gets the refreshed parameters back, then
      // fans them out).
      const RankId leader = n == main_node ? main : holders.front();
      for (RankId r : holders) {
        if (r == leader) continue;
        add_transfer(bytes, topology, r, leader, grad);
        add_transfer(bytes, topology, leader, r, refresh);
      }
      if (n != main_node) {
        add_transfer(bytes, topology, leader, main, grad);
        add_transfer(bytes, topology, main, leader, refresh);
      }
    }
  }
  return bytes;
}

LinkBytes migration_bytes(const LayoutDiff& diff, std::span<const RankId> old_mains,
                          std::span<const RankId> new_mains, const Topology& topology,
                          const CostParams& params) {
  check_main_ranks("migration_bytes (old mains)", old_mains, new_mains.size(),
                   topology.num_ranks());
  check_main_ranks("migration_bytes (new mains)", new_mains, old_mains.size(),
                   topology.num_ranks());
  LinkBytes bytes(topology);
  for (const ReplicaMove& move : diff.moves) {
    COBALT_CHECK_ARG(move.src_rank >= 0 && move.src_rank < topology.num_ranks() &&
                         move.dst_rank >= 0 && move.dst_rank < topology.num_ranks(),
                     "migration_bytes: move of expert {} from rank {} to {} out of range [0, {})",
                     move.expert, move.src_rank, move.dst_rank, topology.num_ranks());
    add_transfer(bytes, topology, move.src_rank, move.dst_rank, params.expert_param_bytes());
  }
  const double state = params.expert_param_bytes() * params.optimizer_factor;
  for (size_t e = 0; e < old_mains.size(); ++e) {
    add_transfer(bytes, topology, old_mains[e], new_mains[e], state);
  }
  return bytes;
}

double planning_time(double planner_ms, const CostParams& params) {
  return planner_ms * 1e-3 * params.planner_time_scale * (1.0 - params.planner_overlap);
}

double step_planning_time(double sync_ms, double async_plan_ms, double previous_busy_s,
                          const CostParams& params) {
  return planning_time(sync_ms, params) +
         std::max(0.0, planning_time(async_plan_ms, params) - previous_busy_s);
}

}  // namespace cobalt::eval
