// `simulate --dump DIR` (DESIGN.md §3.2): everything needed to recompute every reported metric
// independently, as safetensors files.
//
//   DIR/routing.safetensors    the replayed routing, shared by all policies
//     topk_ids      I32 [L, T, K]   expert ids of every replayed token (T = sum of step sizes, in
//                                   replay order, so cycled traces repeat tokens)
//     source_rank   I32 [T]         source rank of every token, already mapped onto the G ranks
//     step_offsets  I64 [S + 1]     step s owns tokens step_offsets[s] .. step_offsets[s+1]-1
//   DIR/<policy>.safetensors   one per policy that ran (dump_file_name)
//     exec_rank     I32 [L, T, K]   execution rank of every task
//     layout        I32 [S, L, G, slots]  expert id per rank slot of the layout in force at
//                                   (step, layer), -1 for an empty slot
//     step_offsets  I64 [S + 1]
// Metadata (strings) of both: format = "cobalt-dump", version = "1", num_experts, top_k,
// num_nodes, num_ranks, slots_per_rank, first_measured_step; policy files add policy.
// Node of rank r = r / (num_ranks / num_nodes). Files of an earlier dump in DIR (safetensors with
// format "cobalt-dump") are removed first, so DIR never mixes two runs; other files stay.
#pragma once

#include <string>
#include <vector>

#include "cobalt/core/topology.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/eval/step_source.hpp"

namespace cobalt::eval {

// The policy's file name: its name with every character outside [A-Za-z0-9._+-] replaced by '_',
// plus ".safetensors".
std::string dump_file_name(const std::string& policy);

class DumpWriter final : public ReplayObserver {
 public:
  // Creates `dir` (and parents) and writes DIR/routing.safetensors from `source` (a token source;
  // throws kInvalidArgument for load-only sources and on I/O errors). `source` must outlive the
  // writer.
  DumpWriter(std::string dir, const StepSource& source, const Topology& topology,
             int slots_per_rank, int first_measured_step);

  void begin_policy(const std::string& name) override;
  void on_step(int step, int layer, const RoutingBatch& batch, std::span<const RankId> exec_rank,
               const ExpertLayout& layout) override;
  // Writes DIR/<policy>.safetensors.
  void end_policy(const std::string& name) override;

 private:
  std::string dir_;
  Topology topology_;
  int num_experts_, top_k_, num_layers_, num_steps_, slots_per_rank_, first_measured_step_;
  std::vector<int64_t> step_offsets_;  // [S + 1]
  std::vector<int32_t> exec_;          // [L, T, K]
  std::vector<int32_t> layouts_;       // [S, L, G, slots]
};

}  // namespace cobalt::eval
