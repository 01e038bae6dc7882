#include "cobalt/eval/dump.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
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

// Where this process's ids mean something: the kernel's boot id (random per boot, so per machine)
// and the inode of its PID namespace, as "BOOT-NS" (hex and decimal digits). A process id names the
// same process only for a caller with the same tag: another machine sharing the filesystem, or a
// container with its own PID namespace (even under the same host name), has another one. Empty
// when /proc does not say (then nothing is swept).
std::string process_id_scope() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id)) return "";
  std::string hex;
  for (char c : boot_id) {
    if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  }
  struct stat ns {};
  if (hex.size() < 16 || ::stat("/proc/self/ns/pid", &ns) != 0) return "";
  return fmt::format("{}-{}", hex.substr(0, 16), static_cast<uint64_t>(ns.st_ino));
}

// Removes temporary directories `stem`.BOOT-NS-PID-... that a process of this machine and PID
// namespace left behind when it was killed (SIGKILL, Ctrl-C: it had no chance to remove its own;
// they can hold gigabytes). Only directories whose process no longer exists (kill(PID, 0) fails
// with ESRCH) are removed, so a run in progress keeps its own; a name that does not parse, or
// carries another scope, is left alone.
void remove_stale_temporary_directories(const std::filesystem::path& stem,
                                        const std::string& scope) {
  namespace fs = std::filesystem;
  if (scope.empty()) return;
  const std::string prefix = stem.filename().string() + "." + scope + "-";
  std::error_code ec;
  fs::directory_iterator it(stem.has_parent_path() ? stem.parent_path() : fs::path("."), ec);
  if (ec) return;
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !entry.is_directory(ec)) continue;
    const std::string rest = name.substr(prefix.size());  // PID-COUNTER-CLOCK
    pid_t pid = 0;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (error != std::errc() || end == rest.data() + rest.size() || *end != '-' || pid <= 0) {
      continue;
    }
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    fs::remove_all(entry.path(), ec);
  }
}

// Creates a fresh directory named like `stem` plus a unique suffix (the process id's scope, the
// process id, a counter and the clock), mode 0777 minus the umask (so a dump renamed into place
// gets the permissions a new directory would have), after removing the ones killed runs left
// behind. Throws kInvalidArgument when it cannot.
std::string make_temporary_directory(const std::filesystem::path& stem, const std::string& dir) {
  static std::atomic<uint64_t> counter{0};
  const std::string scope = process_id_scope();
  remove_stale_temporary_directories(stem, scope);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const auto clock = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::string candidate =
        fmt::format("{}.{}-{}-{}-{:x}", stem.string(), scope.empty() ? "x" : scope, ::getpid(),
                    counter++, static_cast<uint64_t>(clock) & 0xffffff);
    if (::mkdir(candidate.c_str(), 0777) == 0) return candidate;
    COBALT_CHECK_ERRNO(errno == EEXIST, "--dump {}: cannot create the temporary directory {}: {}",
                       dir, candidate, std::strerror(errno));
  }
  fail_io("--dump {}: cannot create a temporary directory", dir);
}

}  // namespace

std::vector<std::string> dump_file_names(const std::vector<std::string>& policies) {
  std::vector<std::string> names = {"routing.safetensors"};
  for (const auto& p : policies) names.push_back(dump_file_name(p));
  return names;
}

namespace {

// "routing" for a dump's routing.safetensors (a cobalt-trace with a cobalt_dump key), "policy"
// for a policy file (format cobalt-dump), "" for anything else.
std::string dump_file_kind(const std::string& path) {
  try {
    const io::MappedFile file(path, "dump");
    const auto header = io::parse_safetensors_header(file.bytes(), "dump");
    const auto format = header.metadata.find("format");
    if (format == header.metadata.end()) return "";
    if (format->second == "cobalt-dump") return "policy";
    if (format->second == "cobalt-trace" && header.metadata.count("cobalt_dump") == 1) {
      return "routing";
    }
    return "";
  } catch (const Error&) {
    return "";  // not a safetensors file this tool wrote
  }
}

}  // namespace

bool is_dump_file(const std::string& path) { return !dump_file_kind(path).empty(); }

std::string dump_target_problem(const std::string& dir, const std::vector<std::string>& policies,
                                const std::string& input_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return {};  // a new directory: nothing in it to replace
  if (!fs::is_directory(dir, ec)) {
    return fmt::format("--dump {}: exists and is not a directory (give a directory)", dir);
  }
  for (const auto& name : dump_file_names(policies)) {
    const fs::path file = fs::path(dir) / name;
    const auto status = fs::status(file, ec);
    if (!fs::exists(status)) continue;
    if (!input_path.empty() && fs::equivalent(file, input_path, ec)) {
      return fmt::format(
          "--dump {}: {} is the input trace (the dump would replace it; give another "
          "directory)",
          dir, file.string());
    }
    if (!fs::is_regular_file(status)) {
      return fmt::format(
          "--dump {}: {} exists and is not a regular file (move it away or give "
          "another directory)",
          dir, file.string());
    }
    if (!is_dump_file(file.string())) {
      return fmt::format(
          "--dump {}: {} exists and is not an earlier cobalt dump (the dump would replace it; "
          "move it away or give another directory)",
          dir, file.string());
    }
  }
  return {};
}

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
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target = fs::path(dir_);
  if (!target.has_filename()) target = target.parent_path();  // "out/" -> "out"
  COBALT_CHECK_ARG(!target.empty(), "--dump: empty directory name");
  dir_existed_ = fs::exists(target, ec);
  if (dir_existed_) {
    COBALT_CHECK_ARG(fs::is_directory(target, ec), "--dump {}: exists and is not a directory",
                     dir_);
    target = fs::canonical(target, ec);
    COBALT_CHECK_ARG(!ec, "--dump {}: cannot resolve the directory: {}", dir_, ec.message());
    tmp_.path = make_temporary_directory(target / ".cobalt-dump-tmp", dir_);
  } else {
    const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
    fs::create_directories(parent, ec);
    if (ec) {
      fail_io_errno(ec.value(), "--dump {}: cannot create directory '{}': {}", dir_,
                    parent.string(), ec.message());
    }
    tmp_.path = make_temporary_directory(
        parent / ("." + target.filename().string() + ".cobalt-dump-tmp"), dir_);
  }
  dir_ = target.string();
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
  // A cobalt-trace (DESIGN.md §3.1) whose sources are the G ranks, so that `trace info` and
  // `simulate --trace` read it; `cobalt_dump` marks it as a dump's file.
  std::map<std::string, std::string> meta = {
      {"format", "cobalt-trace"},
      {"version", "1"},
      {"cobalt_dump", "routing"},
      {"num_experts", std::to_string(num_experts_)},
      {"top_k", std::to_string(top_k_)},
      {"num_sources", std::to_string(topology_.num_ranks())},
      {"num_nodes", std::to_string(topology_.num_nodes())},
      {"num_ranks", std::to_string(topology_.num_ranks())},
      {"slots_per_rank", std::to_string(slots_per_rank_)},
      {"first_measured_step", std::to_string(first_measured_step_)}};
  const std::vector<io::TensorToWrite> tensors = {
      tensor("topk_ids", io::Dtype::kI32, {num_layers_, num_tokens, top_k_}, ids),
      tensor("source_rank", io::Dtype::kI32, {num_tokens}, src),
      tensor("step_offsets", io::Dtype::kI64, {num_steps_ + 1}, step_offsets_)};
  write_file("routing.safetensors", meta, tensors);
}

DumpWriter::TemporaryDirectory::~TemporaryDirectory() {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

void DumpWriter::write_file(const std::string& name, const std::map<std::string, std::string>& meta,
                            std::span<const io::TensorToWrite> tensors) {
  const std::string path = (std::filesystem::path(tmp_.path) / name).string();
  const std::string shown = (std::filesystem::path(dir_) / name).string();
  io::write_safetensors(path, meta, tensors, "dump " + shown);
  if (std::find(written_.begin(), written_.end(), name) == written_.end()) written_.push_back(name);
}

double DumpWriter::memory_bytes(const StepSource& source, const Topology& topology,
                                int slots_per_rank) {
  double num_tokens = 0;
  for (int s = 0; s < source.num_steps(); ++s)
    num_tokens += static_cast<double>(source.num_tokens(s));
  const double ids = 4.0 * source.num_layers() * num_tokens * source.top_k();
  const double routing = ids + 4.0 * num_tokens;
  const double policy = ids + 4.0 * source.num_steps() * source.num_layers() *
                                  topology.num_ranks() * static_cast<double>(slots_per_rank);
  return std::max(routing, policy);
}

void DumpWriter::commit() {
  namespace fs = std::filesystem;
  COBALT_CHECK(!committed_, kFailedPrecondition, "--dump {}: committed twice", dir_);
  std::error_code ec;
  // A new directory: the whole dump appears at once.
  if (!dir_existed_ && !fs::exists(dir_, ec)) {
    if (::rename(tmp_.path.c_str(), dir_.c_str()) == 0) {
      tmp_.path.clear();
      committed_ = true;
      return;
    }
    COBALT_CHECK_ERRNO(errno == EEXIST || errno == ENOTEMPTY,
                       "--dump {}: cannot rename {} to it: {}", dir_, tmp_.path,
                       std::strerror(errno));
    // Created meanwhile: move the files in, as into any existing directory.
  }
  COBALT_CHECK_ARG(fs::is_directory(dir_, ec), "--dump {}: is not a directory any more", dir_);
  for (const auto& name : written_) {
    const std::string from = (fs::path(tmp_.path) / name).string();
    const std::string to = (fs::path(dir_) / name).string();
    COBALT_CHECK_ERRNO(::rename(from.c_str(), to.c_str()) == 0,
                       "--dump {}: cannot move {} to {}: {}", dir_, from, to, std::strerror(errno));
  }
  committed_ = true;  // the new dump is in place; what follows only tidies up
  // Policy files of an earlier dump that this run did not write (a policy not run this time).
  // Only policy files: every dump writes routing.safetensors, so a routing file under another
  // name is a copy someone made, a trace like any other (perhaps the one being replayed).
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || entry.path().extension() != ".safetensors") continue;
    if (std::find(written_.begin(), written_.end(), name) != written_.end()) continue;
    if (dump_file_kind(entry.path().string()) == "policy") fs::remove(entry.path(), ec);
  }
  fs::remove_all(tmp_.path, ec);
  tmp_.path.clear();
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
  write_file(dump_file_name(name), meta, tensors);
  exec_.clear();
  exec_.shrink_to_fit();
  layouts_.clear();
  layouts_.shrink_to_fit();
}

}  // namespace cobalt::eval
