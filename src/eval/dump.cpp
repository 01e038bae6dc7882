#include "cobalt/eval/dump.hpp"

#include <filesystem>
#include <map>

#include "cobalt/core/error.hpp"
#include "cobalt/io/safetensors.hpp"

namespace cobalt::eval {
namespace {

template <typename T>
io::TensorToWrite tensor(std::string name, io::Dtype dtype, std::vector<int64_t> shape,
                         const std::vector<T>& data) {
  return io::TensorToWrite{std::move(name), dtype, std::move(shape),
                           std::as_bytes(std::span<const T>(data))};
}

// Removes the files an earlier dump left in `dir` (safetensors with format "cobalt-dump"), so the
// directory holds only this run's files; anything else is left alone.
void remove_earlier_dump(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec) || entry.path().extension() != ".safetensors") continue;
    bool ours = false;
    try {
      const io::MappedFile file(entry.path().string(), "dump");
      const auto header = io::parse_safetensors_header(file.bytes(), "dump");
      const auto format = header.metadata.find("format");
      ours = format != header.metadata.end() && format->second == "cobalt-dump";
    } catch (const Error&) {
      ours = false;  // not a safetensors file this tool wrote
    }
    if (ours) std::filesystem::remove(entry.path(), ec);
  }
}

}  // namespace

std::string dump_file_name(const std::string& policy) {
  std::string name = policy;
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '+' || c == '-';
    if (!ok) c = '_';
  }
  return name + ".safetensors";
}

DumpWriter::DumpWriter(std::string dir, const StepSource& source, const Topology& topology,
                       int slots_per_rank, int first_measured_step)
    : dir_(std::move(dir)),
      topology_(topology),
      num_experts_(source.num_experts()),
      top_k_(source.top_k()),
      num_layers_(source.num_layers()),
      num_steps_(source.num_steps()),
      slots_per_rank_(slots_per_rank),
      first_measured_step_(first_measured_step) {
  COBALT_CHECK_ARG(source.has_tokens(),
                   "--dump needs a token-level trace (this one is load-only: no exec ranks)");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  COBALT_CHECK_ARG(!ec, "--dump: cannot create directory '{}': {}", dir_, ec.message());
  remove_earlier_dump(dir_);
  step_offsets_.push_back(0);
  for (int s = 0; s < num_steps_; ++s)
    step_offsets_.push_back(step_offsets_.back() + source.num_tokens(s));
  const int64_t num_tokens = step_offsets_.back();
  std::vector<int32_t> ids(static_cast<size_t>(num_layers_) * num_tokens * top_k_);
  std::vector<int32_t> src(num_tokens);
  StepScratch scratch;
  for (int s = 0; s < num_steps_; ++s) {
    for (int l = 0; l < num_layers_; ++l) {
      RoutingBatch batch = source.batch(s, l, topology_.num_ranks(), scratch);
      std::copy(batch.topk_ids().begin(), batch.topk_ids().end(),
                ids.begin() + (l * num_tokens + step_offsets_[s]) * top_k_);
      if (l == 0) {
        std::copy(batch.source_rank().begin(), batch.source_rank().end(),
                  src.begin() + step_offsets_[s]);
      }
    }
  }
  std::map<std::string, std::string> meta = {
      {"format", "cobalt-dump"},
      {"version", "1"},
      {"num_experts", std::to_string(num_experts_)},
      {"top_k", std::to_string(top_k_)},
      {"num_nodes", std::to_string(topology_.num_nodes())},
      {"num_ranks", std::to_string(topology_.num_ranks())},
      {"slots_per_rank", std::to_string(slots_per_rank_)},
      {"first_measured_step", std::to_string(first_measured_step_)}};
  const std::vector<io::TensorToWrite> tensors = {
      tensor("topk_ids", io::Dtype::kI32, {num_layers_, num_tokens, top_k_}, ids),
      tensor("source_rank", io::Dtype::kI32, {num_tokens}, src),
      tensor("step_offsets", io::Dtype::kI64, {num_steps_ + 1}, step_offsets_)};
  const std::string path = (std::filesystem::path(dir_) / "routing.safetensors").string();
  io::write_safetensors(path, meta, tensors, "dump " + path);
}

void DumpWriter::begin_policy(const std::string&) {
  exec_.assign(static_cast<size_t>(num_layers_) * step_offsets_.back() * top_k_, -1);
  layouts_.assign(
      static_cast<size_t>(num_steps_) * num_layers_ * topology_.num_ranks() * slots_per_rank_, -1);
}

void DumpWriter::on_step(int step, int layer, const RoutingBatch& batch,
                         std::span<const RankId> exec_rank, const ExpertLayout& layout) {
  COBALT_CHECK_INTERNAL(batch.num_tokens() == step_offsets_[step + 1] - step_offsets_[step] &&
                            layout.slots_per_rank() == slots_per_rank_,
                        "dump: step {} layer {} does not match the routing file", step, layer);
  std::copy(exec_rank.begin(), exec_rank.end(),
            exec_.begin() + (layer * step_offsets_.back() + step_offsets_[step]) * top_k_);
  const size_t block = static_cast<size_t>(topology_.num_ranks()) * slots_per_rank_;
  std::copy(layout.slots().begin(), layout.slots().end(),
            layouts_.begin() + (static_cast<size_t>(step) * num_layers_ + layer) * block);
}

void DumpWriter::end_policy(const std::string& name) {
  std::map<std::string, std::string> meta = {
      {"format", "cobalt-dump"},
      {"version", "1"},
      {"policy", name},
      {"num_experts", std::to_string(num_experts_)},
      {"top_k", std::to_string(top_k_)},
      {"num_nodes", std::to_string(topology_.num_nodes())},
      {"num_ranks", std::to_string(topology_.num_ranks())},
      {"slots_per_rank", std::to_string(slots_per_rank_)},
      {"first_measured_step", std::to_string(first_measured_step_)}};
  const std::vector<io::TensorToWrite> tensors = {
      tensor("exec_rank", io::Dtype::kI32, {num_layers_, step_offsets_.back(), top_k_}, exec_),
      tensor("layout", io::Dtype::kI32,
             {num_steps_, num_layers_, topology_.num_ranks(), slots_per_rank_}, layouts_),
      tensor("step_offsets", io::Dtype::kI64, {num_steps_ + 1}, step_offsets_)};
  const std::string path = (std::filesystem::path(dir_) / dump_file_name(name)).string();
  io::write_safetensors(path, meta, tensors, "dump " + path);
  exec_.clear();
  exec_.shrink_to_fit();
  layouts_.clear();
  layouts_.shrink_to_fit();
}

}  // namespace cobalt::eval
