// gemma4rt: the command-line entry point. User mistakes (bad flags, bad files, prompts that do not fit)
// end with one "gemma4rt: error: ..." line on stderr and exit status 1.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"gemma4rt: an inference runtime for Gemma-4 text models"};
  app.set_version_flag("--version", std::string("gemma4rt ") + GEMMA4RT_VERSION);
  // Every option's help shows its default (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  std::map<const CLI::App*, gemma4rt::tools::Action> actions;
  auto add = [&](gemma4rt::tools::Action (*register_command)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    gemma4rt::tools::Action action = register_command(app);
    actions[app.get_subcommands({}).at(before)] = std::move(action);
  };
  add(gemma4rt::tools::add_run_command);
  add(gemma4rt::tools::add_tokenize_command);
  add(gemma4rt::tools::add_make_model_command);
  add(gemma4rt::tools::add_bench_command);
  add(gemma4rt::tools::add_serve_command);
  add(gemma4rt::tools::add_quantize_command);
  add(gemma4rt::tools::add_plan_command);
  add(gemma4rt::tools::add_doctor_command);
  add(gemma4rt::tools::add_verify_command);
  add(gemma4rt::tools::add_devices_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& done) {
    return app.exit(done);  // --help
  } catch (const CLI::ParseError& error) {
    // A bad flag is a user mistake like any other: one line, status 1.
    fmt::print(stderr, "gemma4rt: error: {} (see `gemma4rt {}--help`)\n", error.what(),
               app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name() + " ");
    return 1;
  }
  try {
    for (const auto& [command, action] : actions) {
      if (command->parsed()) return action();
    }
    return 1;
  } catch (const gemma4rt::Error& error) {
    std::fflush(stdout);
    fmt::print(stderr, "gemma4rt: error: {}\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fflush(stdout);
    fmt::print(stderr, "gemma4rt: internal error: {}\n", error.what());
    return 2;
  }
}
