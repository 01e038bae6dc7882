// The `cobalt` command: subcommands registered by cli/*_command.cpp.
#include <fmt/core.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
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
// or 5000 characters from the command line): control bytes as \xNN (UTF-8 text stays), and the
// middle of a message over 1200 characters cut, so its start and its list of valid values stay.
std::string one_line(std::string_view message) {
  std::string out;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  constexpr size_t kMaxChars = 1200, kKept = 550;
  if (out.size() > kMaxChars) {
    out = fmt::format("{} [... {} characters cut ...] {}", out.substr(0, kKept),
                      out.size() - 2 * kKept, out.substr(out.size() - kKept));
  }
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
    const std::string unknown = unknown_subcommand(app, argc, argv);
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
