// The gemma4rt subcommands. Each file in src/tools registers one subcommand on the CLI11 app and
// returns the action to run once parsing succeeded.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace gemma4rt::tools {

using Action = std::function<int()>;

// Flag checks whose messages name the bound (CLI11's own print the whole double range).
const CLI::Validator& at_least_one();
const CLI::Validator& zero_or_more();
const CLI::Validator& seed_value();  // --seed: a whole number; -1 asks for a random one
const CLI::Validator& zero_to_one();   // probabilities: CLI11's Range lets nan through
const CLI::Validator& thread_count();  // --threads: 0 (one per core) to kMaxThreads

Action add_run_command(CLI::App& app);
Action add_tokenize_command(CLI::App& app);
Action add_make_model_command(CLI::App& app);
Action add_bench_command(CLI::App& app);
Action add_serve_command(CLI::App& app);
Action add_quantize_command(CLI::App& app);
Action add_plan_command(CLI::App& app);
Action add_doctor_command(CLI::App& app);
Action add_verify_command(CLI::App& app);
Action add_devices_command(CLI::App& app);

}  // namespace gemma4rt::tools
