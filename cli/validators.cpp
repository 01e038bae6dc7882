// Option validators and output checks shared by the subcommands (commands.hpp).
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/eval/dump.hpp"
#include "cobalt/io/atomic_file.hpp"
#include "commands.hpp"

namespace cobalt::cli {
namespace {

constexpr const char* kDecimalValidatorName = "cobalt-decimal";

// An option value as printed in a message: escaped and cut at 40 characters (a value can be
// megabytes long).
std::string printable_value(const std::string& text) { return printable(text, 40); }

// The value as a double (NaN and infinities included), or nullopt when it is not a decimal number:
// an optional sign, digits with an optional point and exponent (std::from_chars, so no hex such as
// 0x10, which std::stod took, and no surrounding blanks, as for integer options). A value beyond
// the double range is +-infinity (out of range below); one too small for a subnormal is +-0.
std::optional<double> as_number(const std::string& text) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const bool plus = begin != end && *begin == '+';
  if (plus) ++begin;  // from_chars takes '-' only
  if (begin == end || (plus && (*begin == '+' || *begin == '-'))) return std::nullopt;
  double value = 0;
  const auto [parsed_end, error] = std::from_chars(begin, end, value);
  if (parsed_end != end) return std::nullopt;
  if (error == std::errc::result_out_of_range) {
    // from_chars leaves the value unset; strtod reads the same (already checked) decimal text as
    // +-HUGE_VAL when huge and +-0 or a subnormal when tiny, whatever its digits and exponent.
    return std::strtod(std::string(begin, end).c_str(), nullptr);
  }
  if (error != std::errc()) return std::nullopt;
  return value;
}

// "" when `text` is a finite number that `fits`; else the message naming `range`.
template <typename Fits>
std::string check_number(std::string& text, const std::string& range, Fits fits) {
  const std::optional<double> value = as_number(text);
  if (!value.has_value()) {
    return fmt::format("value '{}' is not a number (valid: {})", printable_value(text), range);
  }
  if (std::isfinite(*value) && fits(*value)) {
    // Hand CLI11 the checked value exactly: it converts with strtold and then rounds to double,
    // which can land elsewhere (0.99999999999999994... passed (0, 1) and was stored as 1). A hex
    // float converts exactly; -0 becomes 0.
    text = *value == 0 ? std::string("0") : fmt::format("{:a}", *value);
    return {};
  }
  return fmt::format("value {} out of range {}", printable_value(text), range);
}

}  // namespace

const CLI::Validator& non_negative() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        return check_number(text, "(a finite number >= 0)", [](double v) { return v >= 0; });
      },
      "NUMBER >= 0");
  return validator;
}

const CLI::Validator& positive() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        return check_number(text, "(a finite number > 0)", [](double v) { return v > 0; });
      },
      "NUMBER > 0");
  return validator;
}

const CLI::Validator& seed_value() {
  static const CLI::Validator validator =
      integer_in(0, std::numeric_limits<uint64_t>::max(), "[0, 2^64 - 1]");
  return validator;
}

namespace {

// The canonical decimal form of `text` ("+007" -> "7", "-0" -> "0") when it is an optional sign
// followed by decimal digits; nullopt otherwise. CLI11 reads integers with strtoll(..., 0), so
// "010" would be octal 8 and "0x10" hexadecimal 16: only this form is passed on to it.
std::optional<std::string> canonical_decimal(const std::string& text) {
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i == text.size()) return std::nullopt;
  for (size_t j = i; j < text.size(); ++j) {
    if (text[j] < '0' || text[j] > '9') return std::nullopt;
  }
  while (i + 1 < text.size() && text[i] == '0') ++i;
  std::string digits = text.substr(i);
  if (digits == "0") negative = false;
  return negative ? "-" + digits : digits;
}

}  // namespace

CLI::Validator integer_in(int64_t lo, uint64_t hi, const std::string& range_text) {
  const std::string range = range_text.empty() ? fmt::format("[{}, {}]", lo, hi) : range_text;
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const auto canonical = canonical_decimal(text);
        if (!canonical) {
          return fmt::format("value '{}' is not a decimal integer (valid range {})",
                             printable_value(text), range);
        }
        const bool negative = (*canonical)[0] == '-';
        const std::string digits = negative ? canonical->substr(1) : *canonical;
        uint64_t magnitude = 0;
        const auto [ptr, ec] =
            std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
        bool ok = ec == std::errc() && ptr == digits.data() + digits.size();
        if (ok && negative) {
          // -magnitude >= lo, without forming -magnitude when it does not fit.
          ok = lo < 0 && magnitude <= static_cast<uint64_t>(-(lo + 1)) + 1;
        } else if (ok) {
          ok = magnitude <= hi && (lo <= 0 || magnitude >= static_cast<uint64_t>(lo));
        }
        if (!ok) return fmt::format("value {} out of range {}", printable_value(text), range);
        text = *canonical;
        return {};
      },
      "", kDecimalValidatorName);
}

CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open) {
  const std::string range =
      fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  return CLI::Validator(
      [lo, hi, lo_open, hi_open, range](std::string& text) -> std::string {
        return check_number(text, range, [&](double v) {
          return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        });
      },
      fmt::format("NUMBER in {}", range));
}

void decimal_integer_options(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    const bool integer = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
    if (!integer) continue;
    try {
      option->get_validator(kDecimalValidatorName);
      continue;  // has its own range already
    } catch (const CLI::OptionNotFound&) {
    }
    option->transform(
        type.rfind("UINT", 0) == 0
            ? integer_in(0, std::numeric_limits<uint64_t>::max())
            : integer_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  }
  for (CLI::App* sub : app.get_subcommands({})) decimal_integer_options(*sub);
}

namespace {

// A validator refusing "" with `message`; `type` is the option's placeholder in --help.
CLI::Validator refuse_empty(std::string message, std::string type) {
  return CLI::Validator(
      [message](std::string& text) -> std::string { return text.empty() ? message : ""; },
      std::move(type));
}

}  // namespace

const CLI::Validator& non_empty_path() {
  static const CLI::Validator validator = refuse_empty("empty path (give a file name)", "PATH");
  return validator;
}

const CLI::Validator& non_empty_directory() {
  static const CLI::Validator validator = refuse_empty("empty path (give a directory)", "DIR");
  return validator;
}

const CLI::Validator& non_empty_name() {
  static const CLI::Validator validator =
      refuse_empty("empty name (see `cobalt trace gen --list-presets`)", "NAME");
  return validator;
}

const CLI::Validator& non_empty_value() {
  static const CLI::Validator validator =
      refuse_empty("empty value (leave the option out for its default)", "");
  return validator;
}

void require_output_directory(const std::string& path, const std::string& option) {
  if (path.empty()) throw UsageError(fmt::format("{}: empty path", option));
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
    throw UsageError(
        fmt::format("{} {}: directory {} does not exist", option, path, parent.string()));
  }
}

namespace {

namespace fs = std::filesystem;

// 0 when a file can be created in `dir` (a temporary file is created there and removed), else
// the errno that refused it.
int cannot_create_in(const fs::path& dir) {
  std::string name = ((dir.empty() ? fs::path(".") : dir) / ".cobalt-probe-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(name.c_str());
  return 0;
}

// Whether `a` and `b` name the same file: the same inode when both exist, else the same path once
// links and ".." are resolved.
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) {
    std::error_code e;
    return fs::equivalent(a, b, e);
  }
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb && ca == cb;
}

// Written in place, not replaced (io/atomic_file.hpp): an existing FIFO or character device, or
// this process's stdout or stderr. Two outputs may share one (--json /dev/stdout --report
// /dev/stdout writes both, in order).
bool is_stream(const std::string& path) {
  try {
    return io::resolve_output_target(path, "output").direct;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void require_output_file(const std::string& path, const std::string& option,
                         const std::string& input_path) {
  require_output_directory(path, option);
  std::error_code error;
  if (fs::is_directory(path, error)) {
    throw UsageError(fmt::format("{} {}: is a directory (give a file name)", option, path));
  }
  io::OutputTarget target;
  try {
    target = io::resolve_output_target(path, option);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  // A link may name a file in another directory: that one must exist too.
  const fs::path target_parent = fs::path(target.path).parent_path();
  if (!target.direct && !target_parent.empty() && !fs::is_directory(target_parent, error)) {
    throw UsageError(
        fmt::format("{} {}: names {}, whose directory does not exist", option, path, target.path));
  }
  if (!input_path.empty() && fs::exists(path, error) && fs::equivalent(path, input_path, error)) {
    throw UsageError(
        fmt::format("{} {}: is the input trace (it would be overwritten; give "
                    "another file)",
                    option, path));
  }
  if (target.direct) return;
  if (fs::exists(target.path, error) && ::access(target.path.c_str(), W_OK) != 0) {
    throw UsageError(fmt::format(
        "{} {}: the file is not writable (its permissions protect it; change them or give "
        "another file)",
        option, path));
  }
  // The file is written next to its target and renamed over it (io/atomic_file.hpp); an existing
  // writable file in a directory that cannot hold the temporary file is written in place.
  const int why = cannot_create_in(target_parent);
  if (why == 0) return;
  // The writer's own rule: only a directory whose permissions refuse new files lets an existing
  // writable file be written in place (io/atomic_file.hpp); any other failure (/proc, no space)
  // would fail the write, after the run.
  const bool permission = why == EACCES || why == EPERM || why == EROFS;
  if (permission && fs::exists(target.path, error) && ::access(target.path.c_str(), W_OK) == 0) {
    return;
  }
  throw UsageError(fmt::format("{} {}: cannot create files in directory {}: {}", option, path,
                               target_parent.empty() ? "." : target_parent.string(),
                               std::strerror(why)));
}

void require_dump_directory(const std::string& dir, const std::vector<std::string>& policies,
                            const std::string& input_path) {
  if (dir.empty()) throw UsageError("--dump: empty path (give a directory)");
  fs::path target(dir);
  if (!target.has_filename()) target = target.parent_path();
  std::error_code error;
  fs::path writable;  // where the dump's temporary directory goes
  if (fs::exists(target, error)) {
    if (!fs::is_directory(target, error)) {
      throw UsageError(
          fmt::format("--dump {}: exists and is not a directory (give a directory)", dir));
    }
    writable = target;
  } else {
    const fs::path parent = target.parent_path();
    if (!parent.empty() && !fs::is_directory(parent, error)) {
      throw UsageError(fmt::format("--dump {}: directory {} does not exist", dir, parent.string()));
    }
    writable = parent;
  }
  const int why = cannot_create_in(writable);
  if (why != 0) {
    throw UsageError(fmt::format("--dump {}: cannot create files in directory {}: {}", dir,
                                 writable.empty() ? "." : writable.string(), std::strerror(why)));
  }
  const std::string problem = eval::dump_target_problem(dir, policies, input_path);
  if (!problem.empty()) throw UsageError(problem);
}

void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& files,
                              const std::string& dump_dir,
                              const std::vector<std::string>& dump_names) {
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& [option, path] = files[i];
    if (path.empty() || is_stream(path)) continue;
    for (size_t j = i + 1; j < files.size(); ++j) {
      if (files[j].second.empty() || !same_path(path, files[j].second)) continue;
      throw UsageError(fmt::format("{} {} and {} {} are the same file (give each output its own)",
                                   option, path, files[j].first, files[j].second));
    }
    if (dump_dir.empty()) continue;
    if (same_path(path, dump_dir)) {
      throw UsageError(fmt::format(
          "{} {}: is the --dump directory (give the output and the dump different names)", option,
          path));
    }
    const fs::path file(path);
    const std::string parent = file.parent_path().empty() ? "." : file.parent_path().string();
    const bool in_dump = same_path(parent, dump_dir);
    if (in_dump && std::find(dump_names.begin(), dump_names.end(), file.filename().string()) !=
                       dump_names.end()) {
      throw UsageError(
          fmt::format("{} {}: --dump {} writes a file of that name (give the output another name)",
                      option, path, dump_dir));
    }
  }
}

}  // namespace cobalt::cli
