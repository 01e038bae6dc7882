// The `cobalt` command: subcommands registered by cli/*_command.cpp.
#include <fmt/core.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/text.hpp"
#include "commands.hpp"

namespace {

// An error message as one line of bounded length, whatever it quotes (a newline, a terminal escape
// or 5000 characters from the command line): control characters (C0, DEL and C1) as \xNN, other
// UTF-8 text as it is, and the middle of a message over 1200 characters cut, so its start and its
// list of valid values stay. Cuts fall between characters and escapes, never inside one.
std::string one_line(std::string_view message) {
  std::vector<std::string> units;  // one character or one escape each
  for (size_t i = 0; i < message.size();) {
    const auto byte = static_cast<unsigned char>(message[i]);
    size_t length = 1;
    if (byte >= 0xc0) {  // a UTF-8 lead byte: take its continuation bytes along
      while (i + length < message.size() && length < 4 &&
             (static_cast<unsigned char>(message[i + length]) & 0xc0) == 0x80) {
        ++length;
      }
    }
    const std::string_view unit = message.substr(i, length);
    const bool c1 = length == 2 && byte == 0xc2 && static_cast<unsigned char>(unit[1]) < 0xa0;
    const bool stray =
        (byte >= 0x80 && byte < 0xc0) || byte >= 0xf8 || (byte >= 0xc0 && length == 1);
    if (byte < 0x20 || byte == 0x7f || c1 || stray) {
      std::string escaped;
      for (const char c : unit) escaped += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      units.push_back(std::move(escaped));
    } else {
      units.emplace_back(unit);
    }
    i += length;
  }
  constexpr size_t kMaxUnits = 1200, kKept = 550;
  std::string out;
  if (units.size() <= kMaxUnits) {
    for (const auto& unit : units) out += unit;
    return out;
  }
  for (size_t k = 0; k < kKept; ++k) out += units[k];
  out += fmt::format(" [... {} characters cut ...] ", units.size() - 2 * kKept);
  for (size_t k = units.size() - kKept; k < units.size(); ++k) out += units[k];
  return out;
}

// "unknown subcommand 'X' (valid: ...)" when a word on the command line is neither an option nor
// a subcommand of the command before it (CLI11 would only say that a subcommand is required);
// empty otherwise.
std::string unknown_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subcommands = current->get_subcommands({});
    if (word.empty() || word[0] == '-' || subcommands.empty()) return {};
    CLI::App* next = nullptr;
    for (CLI::App* sub : subcommands) {
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr) {
      std::vector<std::string> names;
      for (CLI::App* sub : subcommands) names.push_back(sub->get_name());
      return fmt::format("unknown subcommand '{}' (valid: {})", cobalt::printable(word),
                         fmt::join(names, ", "));
    }
    current = next;
  }
  return {};
}

// Levenshtein distance between two option names, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// True when `word` reads as a decimal number ("-1", "-0.5", "-2e3"): a negative option value or
// positional argument, not an option. Not "-inf", "-nan" or hex, which no option takes.
bool is_number(std::string_view word) {
  size_t i = word.starts_with('-') ? 1 : 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < word.size() && word[i] >= '0' && word[i] <= '9') ++i;
    return i - start;
  };
  size_t mantissa = digits();
  if (i < word.size() && word[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < word.size() && (word[i] == 'e' || word[i] == 'E')) {
    ++i;
    if (i < word.size() && (word[i] == '+' || word[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == word.size();
}

// "unknown option '--X' for 'cobalt sub' (did you mean --Y?)" for the first word that looks like
// an option but is not one of the command it follows (CLI11 takes a command's options only after
// that command's name, its parents' not); empty otherwise. The values of known options are
// skipped, as CLI11 takes them even when they start with '-'. CLI11 checks required options before
// unknown ones, so without this a misspelt option of a command with required options is reported
// as a missing option.
std::string unknown_option(CLI::App& app, int argc, char** argv) {
  std::vector<CLI::App*> chain{&app};
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return {};
    if (word.empty() || word == "-" || is_number(word)) continue;
    if (word[0] != '-') {
      for (CLI::App* sub : chain.back()->get_subcommands({})) {
        if (sub->get_name() == word) {
          chain.push_back(sub);
          break;
        }
      }
      continue;
    }
    const size_t equals = word.find('=');
    const std::string name = word.substr(0, equals);
    if (const CLI::Option* option = chain.back()->get_option_no_throw(name)) {
      if (equals == std::string::npos) i += std::max(0, option->get_items_expected_min());
      continue;
    }
    std::string command_name = "cobalt";
    for (size_t k = 1; k < chain.size(); ++k) command_name += " " + chain[k]->get_name();
    std::string closest;
    size_t closest_distance = 3;  // suggest only names within two edits
    for (const CLI::Option* option : chain.back()->get_options()) {
      for (const std::string& long_name : option->get_lnames()) {
        const size_t distance = edit_distance(name, "--" + long_name);
        if (distance < closest_distance) {
          closest_distance = distance;
          closest = "--" + long_name;
        }
      }
    }
    return fmt::format("unknown option '{}' for '{}'{}", cobalt::printable(name), command_name,
                       closest.empty() ? "" : fmt::format(" (did you mean {}?)", closest));
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cobalt: expert layout planning and task assignment for expert-parallel MoE training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cobalt 0.1.0");
  cobalt::cli::register_trace_commands(app);
  cobalt::cli::register_simulate_command(app);
  cobalt::cli::register_plan_command(app);
  cobalt::cli::register_eplb_command(app);
  cobalt::cli::register_bench_command(app);
  cobalt::cli::decimal_integer_options(app);
  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    status = app.exit(e);  // help and version go to stdout: checked below like any output
  } catch (const CLI::CallForAllHelp& e) {
    status = app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    status = app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string unknown = unknown_subcommand(app, argc, argv);
    const bool about_words = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr ||
                             dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
    if (unknown.empty() && about_words) unknown = unknown_option(app, argc, argv);
    cobalt::cli::write_stderr(fmt::format("cobalt: usage error: {} (see --help)\n",
                                          one_line(unknown.empty() ? e.what() : unknown)));
    return 2;
  } catch (const cobalt::cli::UsageError& e) {
    cobalt::cli::write_stderr(fmt::format("cobalt: usage error: {}\n", one_line(e.what())));
    return 2;
  } catch (const cobalt::IoError& e) {
    cobalt::cli::write_stderr(fmt::format("cobalt: I/O error: {}\n", one_line(e.what())));
    return 1;
  } catch (const cobalt::Error& e) {
    cobalt::cli::write_stderr(
        fmt::format("cobalt: {}: {}\n", cobalt::error_code_name(e.code()), one_line(e.what())));
    return 1;
  } catch (const std::bad_alloc&) {
    // A literal: formatting could need the memory that just ran out.
    cobalt::cli::write_stderr(
        "cobalt: error: out of memory (the input or options need more memory than this machine "
        "has; try fewer tokens, steps or layers)\n");
    return 1;
  } catch (const std::exception& e) {
    cobalt::cli::write_stderr(fmt::format("cobalt: error: {}\n", one_line(e.what())));
    return 1;
  }
  // Results printed to stdout count only if they arrived (a full disk, a closed pipe).
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
    cobalt::cli::write_stderr(
        fmt::format("cobalt: error: cannot write to standard output: {}\n", std::strerror(errno)));
    return 1;
  }
  return status;
}
