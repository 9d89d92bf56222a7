// The engine flags every model-running subcommand shares: --dtype, --reference, --threads, --kv.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/transformer.h"

namespace gemma4rt::tools {

struct EngineFlags {
  std::string dtype;      // "", "f32", "bf16", "q8"
  std::string kv;         // "", "f32", "bf16"
  bool reference = false;
  int threads = 0;

  void add_to(CLI::App& command);
  EngineOptions options() const;  // throws Error for inconsistent choices
};

}  // namespace gemma4rt::tools
