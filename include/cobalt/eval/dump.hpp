// `simulate --dump DIR` (DESIGN.md §3.2): everything needed to recompute every reported metric
// independently, as safetensors files.
//
//   DIR/routing.safetensors    the replayed routing, shared by all policies: a cobalt-trace v1
//                              (num_sources = G; metadata cobalt_dump = "routing" marks it as a
//                              dump's), so `cobalt trace info` and `simulate --trace` read it
//     topk_ids      I32 [L, T, K]   expert ids of every replayed token (T = sum of step sizes, in
//                                   replay order, so cycled traces repeat tokens)
//     source_rank   I32 [T]         source rank of every token, already mapped onto the G ranks
//     step_offsets  I64 [S + 1]     step s owns tokens step_offsets[s] .. step_offsets[s+1]-1
//   DIR/<policy>.safetensors   one per policy that ran (dump_file_name)
//     exec_rank     I32 [L, T, K]   execution rank of every task
//     layout        I32 [S, L, G, slots]  expert id per rank slot of the layout in force at
//                                   (step, layer), -1 for an empty slot
//     step_offsets  I64 [S + 1]
// Metadata (strings) of both: version = "1", num_experts, top_k, num_nodes, num_ranks,
// slots_per_rank, first_measured_step; format = "cobalt-trace" (with num_sources and cobalt_dump)
// for the routing file, "cobalt-dump" (with policy) for the policy files.
// Node of rank r = r / (num_ranks / num_nodes).
//
// All or nothing: the files are written into a temporary directory (a hidden sibling of DIR, or a
// hidden directory inside DIR when DIR exists), and commit() moves them into place only once every
// file is complete: a new DIR is renamed into place whole; in an existing DIR each file replaces
// its old version by a rename, then the files of an earlier dump that this run did not write are
// removed (policy files of an earlier dump: format cobalt-dump), so DIR never mixes two runs;
// other files stay (also copies of a routing file, which is a trace anyone may replay).
// Until commit() DIR is untouched, and a writer destroyed without commit() (an error, an
// exception) removes its temporary directory.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/topology.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/io/safetensors.hpp"

namespace cobalt::eval {

// The policy's file name: its name with every character outside [A-Za-z0-9._+-] replaced by '_',
// plus ".safetensors".
std::string dump_file_name(const std::string& policy);
// Every file name a dump of `policies` writes into DIR: routing.safetensors, then one per policy.
std::vector<std::string> dump_file_names(const std::vector<std::string>& policies);
// True when `path` is an earlier dump's file: a safetensors file with metadata format
// "cobalt-dump", or "cobalt-trace" with a cobalt_dump key (routing.safetensors).
bool is_dump_file(const std::string& path);
// Empty when a dump of `policies` may go to `dir`, else why not (one line): `dir` exists and is not
// a directory, or a file the dump writes there exists and is the file at `input_path` (the trace
// being replayed: same inode, links followed), is not a regular file, or is a regular file that is
// not an earlier dump (a user's file it would replace).
std::string dump_target_problem(const std::string& dir, const std::vector<std::string>& policies,
                                const std::string& input_path);

class DumpWriter final : public ReplayObserver {
 public:
  // Creates the temporary directory (and DIR's missing parents) and writes routing.safetensors
  // there from `source` (a token source; throws kInvalidArgument for load-only sources and on I/O
  // errors). `source` must outlive the writer.
  DumpWriter(std::string dir, const StepSource& source, const Topology& topology,
             int slots_per_rank, int first_measured_step);
  // Removes the temporary directory unless commit() succeeded.
  ~DumpWriter() override = default;
  DumpWriter(const DumpWriter&) = delete;
  DumpWriter& operator=(const DumpWriter&) = delete;

  // The peak memory a writer holds for `source`, in bytes (for an up-front check): the routing
  // file's ids and sources while it is written, then one policy's exec ranks [L, T, K] and layouts
  // [S, L, G, slots] at a time.
  static double memory_bytes(const StepSource& source, const Topology& topology,
                             int slots_per_rank);

  // Moves the complete dump into DIR (see the top of this file). Throws kInvalidArgument when a
  // file cannot be moved.
  void commit();

  void begin_policy(const std::string& name) override;
  void on_step(int step, int layer, const RoutingBatch& batch, std::span<const RankId> exec_rank,
               const ExpertLayout& layout) override;
  // Writes DIR/<policy>.safetensors.
  void end_policy(const std::string& name) override;

 private:
  // Writes tmp_dir_/name and records it for commit().
  void write_file(const std::string& name, const std::map<std::string, std::string>& meta,
                  std::span<const io::TensorToWrite> tensors);

  // Removed with everything in it when destroyed, unless `path` was cleared (committed). A member,
  // so that a constructor that throws after creating it removes it too.
  struct TemporaryDirectory {
    std::string path;
    TemporaryDirectory() = default;
    TemporaryDirectory(const TemporaryDirectory&) = delete;
    TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
    ~TemporaryDirectory();
  };

  std::string dir_;         // DIR, links resolved when it exists
  TemporaryDirectory tmp_;  // the files until commit()
  bool dir_existed_ = false, committed_ = false;
  std::vector<std::string> written_;  // file names in tmp_dir_
  Topology topology_;
  int num_experts_, top_k_, num_layers_, num_steps_, slots_per_rank_, first_measured_step_;
  std::vector<int64_t> step_offsets_;  // [S + 1]
  std::vector<int32_t> exec_;          // [L, T, K]
  std::vector<int32_t> layouts_;       // [S, L, G, slots]
};

}  // namespace cobalt::eval
