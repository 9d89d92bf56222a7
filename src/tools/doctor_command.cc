// gemma4rt doctor: checks a checkpoint directory before anyone trusts a runtime on it. One line per check,
// `PASS|INFO|WARN|FAIL  name: reason`, then a summary; --json prints one object instead. Exit status 1
// when any check fails (a broken checkpoint is a finding here, not an error of the command).
#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "diagnostics/checkpoint_checks.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace gemma4rt::tools {
namespace {

struct DoctorFlags {
  std::string model_dir;
  bool json = false;
  bool no_forward = false;
  bool no_scan = false;
  int threads = 0;
  std::string backend = "cpu";
  bool reference = false;
  int device = -1;
};

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

int doctor(const DoctorFlags& flags) {
  DoctorOptions options;
  options.run_forward = !flags.no_forward;
  options.scan_values = !flags.no_scan;
  options.threads = flags.threads;
  options.backend = chosen_backend(flags.backend, flags.reference, flags.device);
  options.device = flags.device;
  const DoctorReport report = run_checkpoint_checks(flags.model_dir, options);

  if (flags.json) {
    nlohmann::json checks = nlohmann::json::array();
    for (const CheckResult& check : report.checks) {
      checks.push_back({{"name", check.name}, {"status", lower(check_status_name(check.status))}, {"message", check.message}});
    }
    const nlohmann::json output = {{"model", flags.model_dir}, {"checks", checks}, {"ok", report.ok()}};
    // Messages may quote undecodable token text; replace it rather than abort the dump.
    fmt::print("{}\n", output.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    for (const CheckResult& check : report.checks) fmt::print("{}  {}: {}\n", check_status_name(check.status), check.name, check.message);
    fmt::print("doctor: {}: {} pass, {} info, {} warn, {} fail: {}\n", flags.model_dir, report.count(CheckStatus::kPass),
               report.count(CheckStatus::kInfo), report.count(CheckStatus::kWarn), report.count(CheckStatus::kFail),
               report.ok() ? "OK" : "FAILED");
  }
  return report.ok() ? 0 : 1;
}

}  // namespace

Action add_doctor_command(CLI::App& app) {
  auto flags = std::make_shared<DoctorFlags>();
  CLI::App* command =
      app.add_subcommand("doctor", "Check a checkpoint directory (config, tensors, tokenizer, chat format) before trusting it");
  command->add_option("--model", flags->model_dir, "Checkpoint directory (config.json, *.safetensors, tokenizer.json)")->required();
  command->add_flag("--json", flags->json, "Print one JSON object: {\"checks\":[{name,status,message}],\"ok\":bool}");
  command->add_flag("--no-forward", flags->no_forward, "Skip the one-token forward pass (the only check that computes)");
  command->add_flag("--no-scan", flags->no_scan, "Skip the NaN/inf scan of every stored weight value (it reads the whole checkpoint once)");
  command->add_option("--threads", flags->threads, "Worker threads for the forward check (default: one per core)")
      ->check(thread_count());
  command->add_option("--backend", flags->backend, "Where the forward check runs (default cpu)")->check(CLI::IsMember(backend::backend_names()));
  command->add_flag("--reference", flags->reference, "The same as --backend reference");
  command->add_option("--device", flags->device, "GPU backends: the device index for the forward check (gemma4rt devices lists them)")
      ->check(zero_or_more());
  return [flags] { return doctor(*flags); };
}

}  // namespace gemma4rt::tools
