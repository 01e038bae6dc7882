// Option validators and output checks shared by the subcommands (commands.hpp).
#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "cobalt/core/error.hpp"
#include "cobalt/io/atomic_file.hpp"
#include "commands.hpp"

namespace cobalt::cli {
namespace {

// The value as a finite double, or NaN when it is not a number.
double as_number(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    return used == text.size() ? value : std::nan("");
  } catch (const std::exception&) {
    return std::nan("");
  }
}

}  // namespace

const CLI::Validator& non_negative() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        const double value = as_number(text);
        if (std::isfinite(value) && value >= 0) return {};
        return fmt::format("value {} out of range (a finite number >= 0)", text);
      },
      "NUMBER >= 0");
  return validator;
}

const CLI::Validator& positive() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        const double value = as_number(text);
        if (std::isfinite(value) && value > 0) return {};
        return fmt::format("value {} out of range (a finite number > 0)", text);
      },
      "NUMBER > 0");
  return validator;
}

const CLI::Validator& seed_value() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (!text.empty() && ec == std::errc() && ptr == text.data() + text.size()) return {};
        return fmt::format("value {} out of range (an integer in [0, 2^64 - 1])", text);
      },
      "UINT64");
  return validator;
}

const CLI::Validator& non_empty_path() {
  static const CLI::Validator validator(
      [](std::string& text) -> std::string {
        if (!text.empty()) return {};
        return "empty path (give a file name)";
      },
      "PATH");
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

void require_output_file(const std::string& path, const std::string& option,
                         const std::string& input_path) {
  require_output_directory(path, option);
  namespace fs = std::filesystem;
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
}

}  // namespace cobalt::cli
