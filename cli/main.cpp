// The `cobalt` command: subcommands registered by cli/*_command.cpp.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cobalt/core/error.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "cobalt: expert layout planning and task assignment for expert-parallel MoE training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cobalt 0.1.0");
  cobalt::cli::register_trace_commands(app);
  cobalt::cli::register_simulate_command(app);
  cobalt::cli::register_plan_command(app);
  cobalt::cli::register_eplb_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return 2;
  } catch (const cobalt::cli::UsageError& e) {
    fmt::print(stderr, "cobalt: usage error: {}\n", e.what());
    return 2;
  } catch (const cobalt::Error& e) {
    fmt::print(stderr, "cobalt: {}: {}\n", cobalt::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "cobalt: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
